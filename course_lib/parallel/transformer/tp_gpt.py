"""Lecture 14: the whole TinyGPT tensor-parallel (heads, MLP, vocabulary), optionally sequence-parallel.

Built from a :class:`course_lib.training.transformer.TinyGPT`, whose weights it copies: rank r
keeps its heads, its quarter of each MLP, its rows of the token embedding and of the output
layer (:mod:`course_lib.parallel.transformer.vocab`), and a copy of the position embedding and
the LayerNorms. Per step (``L`` blocks, ``B`` sequences of ``T`` tokens, width ``d``):

- **tensor parallel**: allreduces of $BTd$ floats — one after the embedding, two per block
  forward, two per block and one before the output layer backward — and three of $BT$ floats
  for the cross-entropy (:func:`course_lib.parallel.transformer.formulas.tensor_parallel_traffic`).
- **sequence parallel** (Korthikanti et al. 2022): each of those allreduces is a reduce-scatter
  plus an allgather, and the LayerNorms, the residual stream and the biases work on $T/t$ tokens.
  Their weights see only this rank's tokens, so their gradients are summed over ranks once per
  step (:meth:`TensorParallelGPT.sync_grads`, one allreduce; Megatron does the same).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.comm.communicator import Communicator
from course_lib.parallel.model_parallel.tensor_parallel import (
    copy_to_parallel,
    gather_from_parallel,
    reduce_from_parallel,
    shard_bounds,
)
from course_lib.parallel.transformer.heads import ParallelBlock
from course_lib.parallel.transformer.sequence import (
    allreduce_grads,
    gather_sequence,
    reduce_scatter_sequence,
    sequence_slice,
)
from course_lib.parallel.transformer.vocab import (
    vocab_parallel_cross_entropy,
    vocab_parallel_lookup,
)
from course_lib.training.transformer import TinyGPT

__all__ = ["TensorParallelGPT", "tinygpt_shard"]

_VOCAB = {"tokens_weight": "tokens.weight", "head_weight": "head.weight", "head_bias": "head.bias"}


def tinygpt_shard(
    name: str,
    full: dict[str, torch.Tensor],
    vocab_bounds: tuple[int, int],
    blocks: nn.ModuleList,
    first_layer: int = 0,
) -> torch.Tensor:
    """The part of a full TinyGPT's weights that a split model's parameter ``name`` holds.

    Vocabulary-split tensors take rows ``vocab_bounds``; local block ``i`` is the full model's block
    ``first_layer + i`` (a pipeline stage holds a run of blocks), split as its block says.
    """
    if name in _VOCAB:
        a, b = vocab_bounds
        return full[_VOCAB[name]][a:b]
    if name.startswith("blocks."):
        _, i, rest = name.split(".", 2)
        prefix = f"blocks.{first_layer + int(i)}."
        sub = {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}
        return blocks[int(i)].shard_of(rest, sub)
    return full[name]


class TensorParallelGPT(nn.Module):
    """This rank's shard of ``model``; every rank of ``comm`` runs it on the same batch."""

    def __init__(self, model: TinyGPT, comm: Communicator, sequence_parallel: bool = False) -> None:
        super().__init__()
        vocab, d = model.tokens.weight.shape
        n_head = model.blocks[0].attn.n_head
        self.comm, self.sequence_parallel, self.block = comm, sequence_parallel, model.block
        self.all_vocab = shard_bounds(vocab, comm.world_size, "vocabulary")
        a, b = self.vocab_bounds = self.all_vocab[comm.rank]
        self.tokens_weight = nn.Parameter(torch.empty(b - a, d))
        self.positions = nn.Embedding(model.block, d)
        self.blocks = nn.ModuleList(ParallelBlock(d, n_head, comm) for _ in model.blocks)
        self.norm = nn.LayerNorm(d)
        self.head_weight = nn.Parameter(torch.empty(b - a, d))
        self.head_bias = nn.Parameter(torch.empty(b - a))
        self.load_full(model.state_dict())

    # ---- weights --------------------------------------------------------------------------
    def shard_of(self, name: str, full: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return the part of the full model's weights (``full``) that local parameter ``name`` holds."""
        return tinygpt_shard(name, full, self.vocab_bounds, self.blocks)

    def load_full(self, full: dict[str, torch.Tensor]) -> None:
        """Copy this rank's parts of a full TinyGPT's ``state_dict`` into the local parameters."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(self.shard_of(name, full))

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Return the parameters whose gradients are partial (sequence parallelism), else []."""
        if not self.sequence_parallel:
            return []  # every rank computed them on all tokens: equal gradients, nothing to sum
        split = {"tokens_weight", "head_weight", "head_bias"}
        sharded = ("qkv_", "out_weight", "fc1_", "fc2_weight")
        return [
            p
            for name, p in self.named_parameters()
            if name not in split and not any(s in name for s in sharded)
        ]

    def sync_grads(self) -> None:
        """Sum the partial gradients of the replicated parameters over ranks (one allreduce)."""
        allreduce_grads(self.comm, self.replicated_parameters())

    # ---- forward --------------------------------------------------------------------------
    def _enter(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            return gather_sequence(x, self.comm)
        return copy_to_parallel(x, self.comm)

    def _leave(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            return reduce_scatter_sequence(x, self.comm)
        return reduce_from_parallel(x, self.comm)

    def local_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Return the logits (B, T, this rank's classes) of the next token at every position."""
        t = idx.shape[1]
        if t > self.block:
            raise ValueError(f"a context of {t} tokens is longer than the model's {self.block}")
        positions = torch.arange(t)
        if self.sequence_parallel:
            positions = positions[sequence_slice(t, self.comm)]
        x = self._leave(vocab_parallel_lookup(idx, self.tokens_weight, self.vocab_bounds))
        x = x + self.positions(positions)
        for block in self.blocks:
            x = block(x, self._enter, self._leave)
        return F.linear(self._enter(self.norm(x)), self.head_weight, self.head_bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Return the full logits (B, vocab, T), as TinyGPT does (gathers the classes: for tests)."""
        return gather_from_parallel(self.local_logits(idx), self.comm, self.all_vocab).transpose(
            1, 2
        )

    def loss(self, idx: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return the mean cross-entropy over every token (equal on every rank)."""
        logits = self.local_logits(idx)
        return vocab_parallel_cross_entropy(logits, y, self.comm, self.vocab_bounds).mean()
