"""Lecture 14: a TinyGPT block split by attention heads (Shoeybi et al. 2019, "Megatron-LM", fig. 3).

Heads are independent until the output projection mixes them, so rank r keeps heads
``head_bounds[r]``: its rows of Q, K and V (a column-parallel ``qkv``), attention over all $T$
tokens for those heads only, and its columns of the output projection (row-parallel), whose
partial sums one allreduce adds. The MLP is lecture 9's pair (column-parallel first layer,
row-parallel second). Each half of a block therefore costs one allreduce forward (``g``) and
one backward (``f``), 4 per block and step in all, of batch x T x d floats each.

``enter`` and ``leave`` are the operators around each half: ``f`` / ``g`` for tensor
parallelism, gather / reduce-scatter along the sequence for sequence parallelism
(:mod:`course_lib.parallel.transformer.sequence`); the block does not know which.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.comm.communicator import Communicator
from course_lib.parallel.model_parallel.tensor_parallel import shard_bounds

__all__ = ["HeadParallelAttention", "ParallelBlock", "block_shards"]

Operator = Callable[[torch.Tensor], torch.Tensor]


def block_shards(d_model: int, n_head: int, comm: Communicator) -> dict[str, tuple[int, int]]:
    """Return this rank's heads, its columns of the attention (d) and of the MLP's hidden layer (4d)."""
    heads = shard_bounds(n_head, comm.world_size, "attention heads")[comm.rank]
    dh = d_model // n_head
    return {
        "heads": heads,
        "attn": (heads[0] * dh, heads[1] * dh),
        "mlp": shard_bounds(4 * d_model, comm.world_size, "MLP hidden layer")[comm.rank],
    }


class HeadParallelAttention(nn.Module):
    """Causal self-attention over this rank's heads; returns the output projection's partial sum."""

    def __init__(self, d_model: int, n_head: int, comm: Communicator) -> None:
        super().__init__()
        self.shards = block_shards(d_model, n_head, comm)
        a, b = self.shards["attn"]
        self.d, self.dh = d_model, d_model // n_head
        self.qkv_weight = nn.Parameter(torch.empty(3 * (b - a), d_model))
        self.qkv_bias = nn.Parameter(torch.zeros(3 * (b - a)))
        self.out_weight = nn.Parameter(torch.empty(d_model, b - a))
        self.out_bias = nn.Parameter(torch.zeros(d_model))  # added once, after the reduction

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, t, _ = h.shape
        q, k, v = F.linear(h, self.qkv_weight, self.qkv_bias).chunk(3, dim=2)
        heads = [z.reshape(n, t, -1, self.dh).transpose(1, 2) for z in (q, k, v)]
        y = F.scaled_dot_product_attention(*heads, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(n, t, -1), self.out_weight)  # no bias yet


class ParallelBlock(nn.Module):
    """x + attention(norm(x)), then x + MLP(norm(x)), each half between ``enter`` and ``leave``."""

    def __init__(self, d_model: int, n_head: int, comm: Communicator) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = HeadParallelAttention(d_model, n_head, comm)
        self.norm2 = nn.LayerNorm(d_model)
        a, b = self.attn.shards["mlp"]
        self.fc1_weight = nn.Parameter(torch.empty(b - a, d_model))
        self.fc1_bias = nn.Parameter(torch.zeros(b - a))
        self.fc2_weight = nn.Parameter(torch.empty(d_model, b - a))
        self.fc2_bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor, enter: Operator, leave: Operator) -> torch.Tensor:
        x = x + leave(self.attn(enter(self.norm1(x)))) + self.attn.out_bias
        hidden = F.gelu(F.linear(enter(self.norm2(x)), self.fc1_weight, self.fc1_bias))
        return x + leave(F.linear(hidden, self.fc2_weight)) + self.fc2_bias

    def shard_of(self, name: str, full: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return this rank's part of the full block's parameter for local parameter ``name``."""
        (a, b), (c, e) = self.attn.shards["attn"], self.attn.shards["mlp"]
        d = self.attn.d
        qkv = lambda w: torch.cat([w[i * d + a : i * d + b] for i in range(3)])  # noqa: E731
        table = {
            "attn.qkv_weight": lambda: qkv(full["attn.qkv.weight"]),
            "attn.qkv_bias": lambda: qkv(full["attn.qkv.bias"]),
            "attn.out_weight": lambda: full["attn.out.weight"][:, a:b],
            "attn.out_bias": lambda: full["attn.out.bias"],
            "fc1_weight": lambda: full["mlp.0.weight"][c:e],
            "fc1_bias": lambda: full["mlp.0.bias"][c:e],
            "fc2_weight": lambda: full["mlp.2.weight"][:, c:e],
            "fc2_bias": lambda: full["mlp.2.bias"],
        }
        return table[name]() if name in table else full[name]
