"""Instructor answers to lecture 15's exercises (notebooks/15_experts_and_composition.ipynb)."""

from __future__ import annotations

from typing import Any

__all__ = ["my_all_to_all", "my_route"]


def my_all_to_all(comm: Any, x: Any) -> Any:
    """Exercise 15.1: pairwise exchange; step k sends block r+k and receives block r-k."""
    import torch

    p, r = comm.world_size, comm.rank
    b = x.shape[0] // p
    out = torch.empty_like(x)
    out[r * b : (r + 1) * b] = x[r * b : (r + 1) * b]
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        got = torch.empty_like(x[:b])
        comm.sendrecv(x[dst * b : (dst + 1) * b].contiguous(), dst, got, src)
        out[src * b : (src + 1) * b] = got
    return out


def my_route(logits: Any, k: int, cap: int) -> tuple[Any, Any]:
    """Exercise 15.2: the k best experts; slots to first choices, then second, ...; -1 when full."""
    import torch

    T, E = logits.shape
    expert = torch.softmax(logits, dim=1).topk(k, dim=1).indices
    slot = torch.full((T, k), -1, dtype=torch.int64)
    used = [0] * E
    for c in range(k):
        for t in range(T):
            e = int(expert[t, c])
            if used[e] < cap:
                slot[t, c] = used[e]
            used[e] += 1
    return expert, slot
