"""Lecture 14: ring attention (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise
Transformers for Near-Infinite Context").

Each rank keeps its queries; the key / value blocks travel around the ring, one hop per step,
so after $P$ steps every query has met every key while no rank ever held more than two key
blocks. The softmax over keys that arrive in pieces is accumulated **online** (Milakov &
Gimelshein 2018; FlashAttention, Dao et al. 2022): per query a running maximum $m$, a running
sum $\\ell$ of $e^{s - m}$ and an unnormalised output; a new block with maximum
$m' > m$ rescales what is there by $e^{m - m'}$. The next block's transfer is posted before
the current block is computed (``overlap=True``), so on a link fast enough it costs nothing.

Backward is a second ring (as in FlashAttention's backward): the key / value blocks travel
again, each with the gradient accumulated for it so far, which is back at its owner after $P$
hops; probabilities are recomputed from the saved log-sum-exp, never stored. What a rank keeps
for backward is its $q, k, v$, output and log-sum-exp: $O(T/P \\cdot d)$, never a $T \\times T$
score matrix; the largest score block it holds at once is one chunk pair.

Causal masking is by chunks (:mod:`course_lib.parallel.transformer.layouts`): a key chunk later
than the query chunk is skipped, an earlier one computed whole, the same chunk masked above
its diagonal. Every rank of ``comm`` calls :func:`ring_attention` with the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.comm.communicator import Communicator, wait_all
from course_lib.parallel.transformer.layouts import Layout

__all__ = ["RingStats", "ring_attention"]

_TAG_KV, _TAG_GRAD = 1401, 1402


@dataclass
class RingStats:
    """What one rank computed: score elements per (batch, head), the largest block, the steps."""

    scores: int = 0
    largest_block: int = 0
    steps: int = 0


def _pairs(layout: Layout, rank: int, src: int) -> list[tuple[slice, slice, bool]]:
    """Return (query slice, key slice, diagonal?) of the chunk pairs ``rank`` computes with ``src``'s keys."""
    out = []
    for qid, qa, qb in layout.local_chunks(rank):
        for kid, ka, kb in layout.local_chunks(src):
            if kid <= qid:
                out.append((slice(qa, qb), slice(ka, kb), kid == qid))
    return out


def _scores(q: torch.Tensor, k: torch.Tensor, diagonal: bool, scale: float) -> torch.Tensor:
    s = (q @ k.transpose(-1, -2)) * scale
    if diagonal:  # the same chunk: key j is later than query i above the diagonal
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s


def _start_shift(comm: Communicator, buf: torch.Tensor, incoming: int, tag: int) -> tuple:
    """Post: send ``buf`` to the next rank, receive the previous rank's block (``incoming`` tokens)."""
    p, r = comm.world_size, comm.rank
    nxt = torch.empty(*buf.shape[:-2], incoming, buf.shape[-1], dtype=buf.dtype)
    recv = comm.irecv(nxt, (r - 1) % p, tag, eager=True)
    return nxt, [recv, comm.isend(buf, (r + 1) % p, tag)]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm, layout, overlap, stats):
        p, r = comm.world_size, comm.rank
        scale = q.shape[-1] ** -0.5
        m = torch.full(q.shape[:-1], float("-inf"))  # running maximum of each query's scores
        ell = torch.zeros(q.shape[:-1])  # running sum of exp(score - m)
        acc = torch.zeros_like(q)  # running sum of exp(score - m) * value
        kv = torch.stack([k, v]).contiguous()
        for step in range(p):
            src = (r - step) % p  # whose keys this rank holds now
            if step < p - 1:
                nxt, handles = _start_shift(comm, kv, layout.size((src - 1) % p), _TAG_KV)
                if not overlap:
                    wait_all(handles)
            for qs, ks, diagonal in _pairs(layout, r, src):
                s = _scores(q[..., qs, :], kv[0][..., ks, :], diagonal, scale)
                m_new = torch.maximum(m[..., qs], s.amax(-1))
                rescale = torch.exp(m[..., qs] - m_new)  # 0 on the first block (m = -inf)
                e = torch.exp(s - m_new.unsqueeze(-1))
                ell[..., qs] = ell[..., qs] * rescale + e.sum(-1)
                acc[..., qs, :] = acc[..., qs, :] * rescale.unsqueeze(-1) + e @ kv[1][..., ks, :]
                m[..., qs] = m_new
                if stats is not None:
                    stats.scores += s.shape[-1] * s.shape[-2]
                    stats.largest_block = max(stats.largest_block, s.shape[-1] * s.shape[-2])
            if step < p - 1:
                wait_all(handles)
                kv = nxt
        if stats is not None:
            stats.steps += p
        out = acc / ell.unsqueeze(-1)
        lse = m + torch.log(ell)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.comm, ctx.layout = comm, layout
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        comm, layout = ctx.comm, ctx.layout
        p, r = comm.world_size, comm.rank
        scale = q.shape[-1] ** -0.5
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # D_i = sum_j P_ij dP_ij, FlashAttention's backward
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)  # the gradient of the block held now, accumulated so far
        for step in range(p):
            src = (r - step) % p
            if step < p - 1:
                nxt, handles = _start_shift(comm, kv, layout.size((src - 1) % p), _TAG_KV)
            for qs, ks, diagonal in _pairs(layout, r, src):
                kb, vb = kv[0][..., ks, :], kv[1][..., ks, :]
                prob = torch.exp(_scores(q[..., qs, :], kb, diagonal, scale) - lse[..., qs, None])
                dkv[1][..., ks, :] += prob.transpose(-1, -2) @ dout[..., qs, :]
                ds = prob * (dout[..., qs, :] @ vb.transpose(-1, -2) - delta[..., qs, None])
                dq[..., qs, :] += (ds @ kb) * scale
                dkv[0][..., ks, :] += (ds.transpose(-1, -2) @ q[..., qs, :]) * scale
            if p > 1:  # the gradient follows its block; after P hops it is home
                back, grad_handles = _start_shift(comm, dkv, layout.size((src - 1) % p), _TAG_GRAD)
                wait_all(grad_handles)
                dkv = back
            if step < p - 1:
                wait_all(handles)
                kv = nxt
        return dq, dkv[0], dkv[1], None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    comm: Communicator,
    layout: Layout,
    overlap: bool = True,
    stats: RingStats | None = None,
) -> torch.Tensor:
    """Return causal attention of this rank's queries over every rank's keys (differentiable).

    ``q``, ``k``, ``v`` are (batch, heads, this rank's tokens, head width), tokens in the order
    of ``layout.positions(rank)``; the output has ``q``'s shape. ``stats`` (optional) counts
    the score elements computed. Every rank of ``comm`` calls it with the same ``layout``.
    """
    if layout.world_size != comm.world_size or q.shape[-2] != layout.size(comm.rank):
        raise ValueError(
            f"rank {comm.rank}: the layout is for {layout.world_size} ranks and gives this rank "
            f"{layout.size(comm.rank) if layout.world_size > comm.rank else 0} tokens, but comm "
            f"has {comm.world_size} ranks and q has {q.shape[-2]}: build the layout with "
            "comm.world_size and pass each rank's own tokens"
        )
    return _RingAttention.apply(q, k.contiguous(), v.contiguous(), comm, layout, overlap, stats)
