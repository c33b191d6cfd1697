"""Lecture 15: TinyGPT trained on a data x pipeline x tensor grid (3D parallelism, Narayanan et al. 2021).

Each dimension is one axis of a :class:`~course_lib.parallel.grid.mesh.ProcessGrid`, and each
collective of a parallelism runs on that axis's sub-communicator, never on the whole world:

- **tensor** (innermost: neighbours, the fastest link): lecture 14's Megatron split of every
  block by heads and MLP columns, the vocabulary split for the embedding and the loss;
- **pipeline**: lecture 10's stages, consecutive blocks per stage; activations and their
  gradients go point-to-point between the same tensor rank of neighbouring stages (a stage's
  activations are replicated over its tensor ranks, so each sends its own copy);
- **data** (outermost): each replica trains on its share of the batch; after the step's
  backward one allreduce averages the gradients of this rank's shard over the replicas.

Stage s of ``pp`` holds blocks ``even_stages(L, pp)[s]``, the first stage also the token and
position embeddings, the last the final LayerNorm, the output layer and the loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.parallel.grid.mesh import ProcessGrid
from course_lib.parallel.model_parallel.tensor_parallel import (
    copy_to_parallel,
    gather_from_parallel,
    reduce_from_parallel,
    shard_bounds,
)
from course_lib.parallel.pipeline_parallel.pipeline import (
    PipelineSettings,
    even_stages,
    pipeline_step,
)
from course_lib.parallel.transformer.heads import ParallelBlock
from course_lib.parallel.transformer.sequence import allreduce_grads
from course_lib.parallel.transformer.tp_gpt import tinygpt_shard
from course_lib.parallel.transformer.vocab import (
    vocab_parallel_cross_entropy,
    vocab_parallel_lookup,
)
from course_lib.training.transformer import TinyGPT

__all__ = ["AXES", "GridStage", "grid_forward", "grid_train_step"]

#: The grid's axes, outermost first: tensor innermost, where ranks are neighbours.
AXES = ("data", "pipeline", "tensor")


class GridStage(nn.Module):
    """This rank's part of ``model``: its pipeline stage, and in it its tensor shard."""

    def __init__(self, model: TinyGPT, grid: ProcessGrid) -> None:
        super().__init__()
        tp, pp = grid["tensor"], grid["pipeline"]
        vocab, d = model.tokens.weight.shape
        n_head, n_layer = model.blocks[0].attn.n_head, len(model.blocks)
        self.tp, self.stage, self.num_stages = tp, pp.rank, pp.world_size
        self.first, self.last = self.stage == 0, self.stage == pp.world_size - 1
        self.layers = even_stages(n_layer, pp.world_size)[self.stage]
        self.all_vocab = shard_bounds(vocab, tp.world_size, "vocabulary")
        a, b = self.vocab_bounds = self.all_vocab[tp.rank]
        if self.first:
            self.tokens_weight = nn.Parameter(torch.empty(b - a, d))
            self.positions = nn.Embedding(model.block, d)
        self.blocks = nn.ModuleList(ParallelBlock(d, n_head, tp) for _ in range(*self.layers))
        if self.last:
            self.norm = nn.LayerNorm(d)
            self.head_weight = nn.Parameter(torch.empty(b - a, d))
            self.head_bias = nn.Parameter(torch.empty(b - a))
        with torch.no_grad():
            full = model.state_dict()
            for name, p in self.named_parameters():
                p.copy_(self.shard_of(name, full))

    def shard_of(self, name: str, full: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return the part of the full model's weights (``full``) that local parameter ``name`` holds."""
        return tinygpt_shard(name, full, self.vocab_bounds, self.blocks, self.layers[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (first stage) or the residual stream in; the stream or this rank's logits out."""
        enter = lambda z: copy_to_parallel(z, self.tp)  # noqa: E731 - Megatron's f
        leave = lambda z: reduce_from_parallel(z, self.tp)  # noqa: E731 - Megatron's g
        if self.first:
            t = x.shape[1]
            x = leave(vocab_parallel_lookup(x, self.tokens_weight, self.vocab_bounds))
            x = x + self.positions(torch.arange(t))
        for block in self.blocks:
            x = block(x, enter, leave)
        if self.last:  # logits (B, T, this rank's classes): the full vocabulary is never formed
            x = F.linear(enter(self.norm(x)), self.head_weight, self.head_bias)
        return x

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return the mean cross-entropy of the last stage's ``logits`` (every tensor rank calls it)."""
        return vocab_parallel_cross_entropy(logits, y, self.tp, self.vocab_bounds).mean()


def grid_forward(stage: GridStage, grid: ProcessGrid, X: torch.Tensor) -> torch.Tensor | None:
    """Return the full logits (B, vocab, T) of this replica's ``X`` on the last stage, None elsewhere.

    Every rank calls it with its replica's batch; activations go stage to stage point-to-point.
    """
    pp = grid["pipeline"]
    x = X
    if not stage.first:
        shape = (X.shape[0], X.shape[1], stage.blocks[0].norm1.normalized_shape[0])
        x = pp.recv(torch.empty(shape), pp.rank - 1, tag=7)
    out = stage(x)
    if not stage.last:
        pp.send(out.contiguous(), pp.rank + 1, tag=7)
        return None
    return gather_from_parallel(out, stage.tp, stage.all_vocab).transpose(1, 2)


def grid_train_step(
    stage: GridStage,
    grid: ProcessGrid,
    settings: PipelineSettings,
    X: torch.Tensor,
    y: torch.Tensor,
):
    """Run one 3D step's forward and backward on this replica's ``X``, ``y``; average gradients.

    The pipeline runs ``settings`` on the ``pipeline`` axis (its tensor collectives inside each
    stage on the ``tensor`` axis); then one allreduce on the ``data`` axis sums this rank's
    gradients over the replicas, divided by their number. Every rank calls it; zero the
    gradients before and step the optimiser after. Returns ``pipeline_step``'s (loss, timeline).
    """
    out = pipeline_step(
        stage,
        grid["pipeline"],
        settings,
        X if stage.first else None,
        y if stage.last else None,
        loss_fn=stage.loss,
    )
    dp = grid["data"]
    params = list(stage.parameters())
    allreduce_grads(dp, params)
    for p in params:
        if p.grad is not None:
            p.grad /= dp.world_size
    return out
