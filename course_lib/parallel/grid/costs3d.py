"""Lecture 15: what one rank of a (dp, tp, pp, cp) grid computes per micro-batch, measured in one process.

The simulator (:mod:`course_lib.parallel.grid.simulate3d`) needs, for each grid, the seconds of
the pieces a rank runs on one micro-batch — the embedding, one block, the head with its loss,
each forward and backward — and the bytes autograd keeps for each until its backward. They
depend on the grid only through the shapes: $b = B/(d\\,m)$ sequences of $T/c$ tokens, and a
block cut $t$ ways (its heads' and MLP columns' share). This module builds those pieces at
those shapes (tensor rank 0's shard, the widest) and times them: the fastest of ``repeats``
(:func:`course_lib.timing.min_of`), as lecture 13 costs its operators. The collectives between
the pieces are the simulator's, not measured here. Context parallelism is costed on $T/c$
tokens attending to themselves: the extra key blocks of ring attention are left out (a
prediction that is low for attention-heavy shapes; lecture 14 measures ring attention itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.parallel.model_parallel.tensor_parallel import shard_bounds
from course_lib.parallel.sharded.activations import SavedBytes
from course_lib.parallel.transformer.heads import ParallelBlock
from course_lib.timing import min_of

__all__ = ["PieceCosts", "measure_piece_costs"]


@dataclass(frozen=True)
class PieceCosts:
    """Seconds (forward, backward) and saved activation bytes of a rank's pieces on one micro-batch."""

    embed: tuple[float, float]
    block: tuple[float, float]
    head: tuple[float, float]
    saved: dict[str, int]


@dataclass(frozen=True)
class _Shard:
    """Which shard of a layer to build: tensor rank 0 of ``world_size`` (no communication)."""

    world_size: int
    rank: int = 0


def _fwd_bwd(run, params, repeats: int) -> tuple[float, float, int]:
    """Return the fastest forward, the fastest backward and the forward's saved bytes."""
    counter = SavedBytes(params)
    with counter.hooks():
        run().sum().backward()
    forward = min_of(lambda: run(), repeats)
    both = min_of(lambda: run().sum().backward(), repeats)
    return forward, max(both - forward, 0.0), counter.total


def measure_piece_costs(
    sizes: dict, microbatch: int, length: int, tp: int, cp: int = 1, repeats: int = 5
) -> PieceCosts:
    """Return the pieces' costs for a TinyGPT of ``sizes`` on a grid with tensor degree ``tp``.

    ``microbatch`` sequences of ``length // cp`` tokens; runs on one thread (an engine's share).
    """
    d, vocab = sizes["d_model"], sizes["vocab"]
    t = max(length // cp, 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        block = ParallelBlock(d, sizes["n_head"], _Shard(tp))
        for p in block.parameters():
            nn.init.normal_(p, std=0.02)
        x = torch.randn(microbatch, t, d, requires_grad=True)
        same = lambda z: z  # noqa: E731 - the collectives are the simulator's tasks
        block_cost = _fwd_bwd(lambda: block(x, same, same), list(block.parameters()), repeats)
        a, b = shard_bounds(vocab, tp, "vocabulary")[0]
        rows = nn.Parameter(torch.randn(b - a, d) * 0.02)
        positions = nn.Embedding(sizes["block"], d)
        idx = torch.randint(0, b - a, (microbatch, t))
        embed = _fwd_bwd(
            lambda: F.embedding(idx, rows) + positions(torch.arange(t)),
            [rows, positions.weight],
            repeats,
        )
        norm, bias = nn.LayerNorm(d), nn.Parameter(torch.zeros(b - a))
        target = torch.randint(0, b - a, (microbatch * t,))
        head = _fwd_bwd(
            lambda: F.cross_entropy(F.linear(norm(x), rows, bias).reshape(-1, b - a), target),
            [rows, bias, *norm.parameters()],
            repeats,
        )
    finally:
        torch.set_num_threads(threads)
    return PieceCosts(
        embed[:2],
        block_cost[:2],
        head[:2],
        {"embed": embed[2], "block": block_cost[2], "head": head[2]},
    )
