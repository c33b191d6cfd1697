"""Lecture 14: DeepSpeed-Ulysses (Jacobs et al. 2023): attention with the sequence split turned
into a head split and back, by two all-to-alls.

Outside attention every rank holds its $T/P$ tokens with all $H$ heads. One **all-to-all**
sends each rank the heads it will own from every rank's tokens: afterwards rank r holds all $T$
tokens of its $H/P$ heads, computes ordinary causal attention on them (heads are
independent), and a second all-to-all sends the outputs back to a split by tokens. Each
all-to-all moves $(P-1)/P$ of a rank's $q, k, v$ (or output): per rank and step
$4 \\cdot B \\frac{T}{P} d \\frac{P-1}{P}$ floats forward, as many backward, a factor $P/2$ less
than ring attention's $2 B T d \\frac{P-1}{P}$ forward. Its limit: $P$ cannot exceed the heads.

The all-to-all is lecture 15's, written from the communicator's point-to-point calls (pairwise
exchange: at step $k$ rank r sends to $r + k$ and receives from $r - k$); the Communicator's
own ``all_to_all`` (the backend's) does the same job.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from course_lib.collectives.all_to_all import pairwise_all_to_all as all_to_all_by_pairs
from course_lib.comm.communicator import Communicator
from course_lib.parallel.model_parallel.tensor_parallel import shard_bounds
from course_lib.parallel.transformer.layouts import Layout

__all__ = ["heads_to_sequence", "pairwise_all_to_all", "sequence_to_heads", "ulysses_attention"]


def pairwise_all_to_all(
    comm: Communicator, chunks: list[torch.Tensor], incoming: list[tuple[int, ...]]
) -> list[torch.Tensor]:
    """Send ``chunks[j]`` to rank j; return the list of what each rank j sent here (shape ``incoming[j]``).

    The chunks travel flat through lecture 15's pairwise exchange
    (:func:`course_lib.collectives.all_to_all.pairwise_all_to_all`: $P - 1$ steps of one
    ``sendrecv``), every chunk a block of its own size; every rank calls it.
    """
    sizes = [math.prod(shape) for shape in incoming]
    flat = torch.cat([chunk.contiguous().reshape(-1) for chunk in chunks])
    out = all_to_all_by_pairs(comm, flat, [c.numel() for c in chunks], sizes)
    return [piece.reshape(shape) for piece, shape in zip(out.split(sizes), incoming, strict=True)]


def _to_heads(x: torch.Tensor, comm: Communicator, layout: Layout) -> torch.Tensor:
    heads = shard_bounds(x.shape[1], comm.world_size, "attention heads")
    a, b = heads[comm.rank]
    chunks = [x[:, ha:hb] for ha, hb in heads]
    incoming = [(x.shape[0], b - a, layout.size(j), x.shape[-1]) for j in range(comm.world_size)]
    return torch.cat(pairwise_all_to_all(comm, chunks, incoming), dim=2)


def _to_sequence(y: torch.Tensor, comm: Communicator, layout: Layout, n_head: int) -> torch.Tensor:
    heads = shard_bounds(n_head, comm.world_size, "attention heads")
    sizes = [layout.size(j) for j in range(comm.world_size)]
    chunks = list(y.split(sizes, dim=2))
    n, t_mine = y.shape[0], sizes[comm.rank]
    incoming = [(n, hb - ha, t_mine, y.shape[-1]) for ha, hb in heads]
    return torch.cat(pairwise_all_to_all(comm, chunks, incoming), dim=1)


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, layout):
        ctx.comm, ctx.layout, ctx.n_head = comm, layout, x.shape[1]
        return _to_heads(x, comm, layout)

    @staticmethod
    def backward(ctx, grad):
        return _to_sequence(grad.contiguous(), ctx.comm, ctx.layout, ctx.n_head), None, None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, comm, layout, n_head):
        ctx.comm, ctx.layout = comm, layout
        return _to_sequence(y, comm, layout, n_head)

    @staticmethod
    def backward(ctx, grad):
        return _to_heads(grad.contiguous(), ctx.comm, ctx.layout), None, None, None


def sequence_to_heads(x: torch.Tensor, comm: Communicator, layout: Layout) -> torch.Tensor:
    """Turn (batch, all heads, this rank's tokens, dh) into (batch, this rank's heads, all tokens, dh)."""
    return _SequenceToHeads.apply(x, comm, layout)


def heads_to_sequence(
    y: torch.Tensor, comm: Communicator, layout: Layout, n_head: int
) -> torch.Tensor:
    """Turn (batch, this rank's heads, all tokens, dh) back into (batch, all heads, this rank's tokens, dh)."""
    return _HeadsToSequence.apply(y, comm, layout, n_head)


def ulysses_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator, layout: Layout
) -> torch.Tensor:
    """Return causal attention of this rank's tokens (batch, heads, tokens, dh), Ulysses-style.

    ``layout`` must be contiguous (rank r holds the r-th block of tokens). q, k and v travel in
    one all-to-all (stacked along the batch), the output in another.
    """
    if layout.name != "contiguous":
        raise ValueError(
            "Ulysses gathers each head's tokens in rank order: use contiguous_layout(T, P)"
        )
    n, n_head = q.shape[0], q.shape[1]
    qkv = sequence_to_heads(torch.cat([q, k, v]).contiguous(), comm, layout)
    y = F.scaled_dot_product_attention(*qkv.split(n), is_causal=True)
    return heads_to_sequence(y.contiguous(), comm, layout, n_head)
