"""Lecture 11 (and 9): a small decoder-only transformer, the kind of model whose memory matters.

GPT-style (Radford et al. 2018; the block as in Vaswani et al. 2017 with the layer norm first):
token and position embeddings, ``n_layer`` blocks of causal self-attention and a two-layer MLP,
each inside a residual connection behind a ``LayerNorm``, and a final ``LayerNorm`` + linear head
over the vocabulary. Per block: 12 d² weights (qkv 3d², attention output d², MLP 8d²) + 13 d
biases and norms, so the default (d = 192, 6 blocks) holds about 2.7 million parameters.

Its logits come out as (N, vocabulary, T), classes second like the U-Net's per-pixel logits, so
``nn.CrossEntropyLoss`` and the kit's ``fit`` / ``evaluate`` train and score it on (N, T) targets
unchanged (the accuracy is the next character's, per position).

Tensor parallelism splits each block as Megatron-LM does (lecture 9): qkv and the MLP's first
layer by columns, the attention output and the MLP's second layer by rows: one allreduce after
attention and one after the MLP in forward, two more in backward (:func:`block_collectives`).
No dropout: a distributed run must be able to equal one process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TinyGPT", "block_collectives", "gpt_param_count"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t sees positions 0..t only."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(
                f"d_model={d_model} must divide into n_head={n_head} heads: choose n_head "
                f"among the divisors of {d_model}"
            )
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        heads = [z.view(n, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v)]
        y = F.scaled_dot_product_attention(*heads, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """A decoder-only transformer over ``vocab`` tokens and contexts of up to ``block`` tokens."""

    def __init__(
        self,
        vocab: int = 96,
        block: int = 64,
        d_model: int = 192,
        n_head: int = 6,
        n_layer: int = 6,
    ) -> None:
        super().__init__()
        if min(vocab, block, d_model, n_head, n_layer) < 1:
            raise ValueError(
                f"every size must be >= 1, got vocab={vocab}, block={block}, d_model={d_model}, "
                f"n_head={n_head}, n_layer={n_layer}"
            )
        self.block = block
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(block, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, n_head) for _ in range(n_layer)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Return the logits (N, vocab, T) of the next token at every position of ``idx`` (N, T)."""
        t = idx.shape[1]
        if t > self.block:
            raise ValueError(
                f"a context of {t} tokens is longer than the model's block of {self.block}: "
                f"cut the input, or build TinyGPT(block={t})"
            )
        h = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        return self.head(self.norm(self.blocks(h))).transpose(1, 2)


def gpt_param_count(vocab: int, block: int, d_model: int, n_layer: int) -> int:
    """Return TinyGPT's parameters by the formula: embeddings, 12d² + 13d per block, the head."""
    d = d_model
    return vocab * d + block * d + n_layer * (12 * d * d + 13 * d) + 2 * d + d * vocab + vocab


def block_collectives(n_layer: int) -> dict[str, int]:
    """Return the allreduces per step of Megatron-style tensor parallelism: 2 per block each way."""
    return {"forward": 2 * n_layer, "backward": 2 * n_layer}
