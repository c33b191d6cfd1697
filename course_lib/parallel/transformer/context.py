"""Lecture 14: the whole TinyGPT context-parallel: each rank holds some tokens of every sequence.

Every rank keeps all the weights (as data parallelism does) and only its tokens' activations
(:mod:`course_lib.parallel.transformer.layouts`). Everything but attention works token by
token, so it runs on the local tokens unchanged; attention is ring attention
(:func:`course_lib.parallel.transformer.ring.ring_attention`) or Ulysses
(:func:`course_lib.parallel.transformer.ulysses.ulysses_attention`). Each rank's loss is the sum
over its tokens divided by all tokens, so the gradients summed over ranks (one allreduce,
:meth:`ContextParallelGPT.sync_grads`) are the full batch's: what Llama 3 calls context
parallelism, a data parallelism over the tokens of one sequence.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.comm.communicator import Communicator
from course_lib.parallel.transformer.layouts import Layout, contiguous_layout, zigzag_layout
from course_lib.parallel.transformer.ring import RingStats, ring_attention
from course_lib.parallel.transformer.sequence import allreduce_grads
from course_lib.parallel.transformer.ulysses import ulysses_attention
from course_lib.training.transformer import TinyGPT

__all__ = ["ATTENTIONS", "ContextParallelGPT"]

#: The context-parallel attentions, each with the layout it uses by default.
ATTENTIONS = {"ring": "zig-zag", "ulysses": "contiguous"}


class ContextParallelGPT(nn.Module):
    """A replica of ``model`` that runs this rank's tokens; every rank of ``comm`` runs it on the same batch."""

    def __init__(
        self,
        model: TinyGPT,
        comm: Communicator,
        attention: str = "ring",
        layout: str | None = None,
        overlap: bool = True,
    ) -> None:
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {sorted(ATTENTIONS)}, got {attention!r}")
        self.layout_name = layout or ATTENTIONS[attention]
        if self.layout_name not in ("zig-zag", "contiguous"):
            raise ValueError(f"layout must be 'zig-zag' or 'contiguous', got {layout!r}")
        self.net, self.comm = copy.deepcopy(model), comm
        self.attention, self.overlap = attention, overlap
        self.stats = RingStats()

    def layout(self, length: int) -> Layout:
        """Return the layout of a sequence of ``length`` tokens over this communicator."""
        make = zigzag_layout if self.layout_name == "zig-zag" else contiguous_layout
        return make(length, self.comm.world_size)

    def shard_of(self, name: str, full: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return the full model's weight that local parameter ``name`` holds (all of it)."""
        return full[name.removeprefix("net.")]

    def _attend(self, attn: nn.Module, h: torch.Tensor, layout: Layout) -> torch.Tensor:
        n, t, d = h.shape
        q, k, v = attn.qkv(h).split(d, dim=2)
        q, k, v = (z.reshape(n, t, attn.n_head, -1).transpose(1, 2) for z in (q, k, v))
        if self.attention == "ring":
            y = ring_attention(q, k, v, self.comm, layout, self.overlap, self.stats)
        else:
            y = ulysses_attention(q, k, v, self.comm, layout)
        return attn.out(y.transpose(1, 2).reshape(n, t, d))

    def local_logits(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (logits (B, this rank's tokens, vocab), their positions) for the batch ``idx`` (B, T)."""
        layout = self.layout(idx.shape[1])
        positions = layout.positions(self.comm.rank)
        x = self.net.tokens(idx[:, positions]) + self.net.positions(positions)
        for block in self.net.blocks:
            x = x + self._attend(block.attn, block.norm1(x), layout)
            x = x + block.mlp(block.norm2(x))
        return self.net.head(self.net.norm(x)), positions

    def loss(self, idx: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return this rank's share of the mean cross-entropy: the sum over ranks is the whole mean."""
        logits, positions = self.local_logits(idx)
        mine = y[:, positions]
        return F.cross_entropy(logits.flatten(0, 1), mine.flatten(), reduction="sum") / y.numel()

    def sync_grads(self) -> None:
        """Sum every parameter's gradient over ranks (one allreduce): the whole batch's gradient."""
        allreduce_grads(self.comm, list(self.parameters()))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Return the full logits (B, vocab, T), as TinyGPT does (gathers every rank's tokens: for tests)."""
        logits, _ = self.local_logits(idx)
        layout = self.layout(idx.shape[1])
        widest = max(layout.size(r) for r in range(self.comm.world_size))
        padded = F.pad(logits.detach(), (0, 0, 0, widest - logits.shape[1])).contiguous()
        rows = torch.as_tensor(self.comm.allgather(padded))
        full = torch.empty(idx.shape[0], idx.shape[1], logits.shape[-1])
        for r in range(self.comm.world_size):
            full[:, layout.positions(r)] = rows[r][:, : layout.size(r)]
        return full.transpose(1, 2)
