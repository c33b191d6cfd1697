"""Instructor answers to lecture 8's exercises (notebooks/08_reproducing_the_papers.ipynb)."""

from __future__ import annotations

__all__ = ["my_regime_rate", "my_values_sent"]


def my_values_sent(averaging: str, size: int, world_size: int, steps: int, period: int) -> float:
    """Exercise 8.1: per averaging, a ring's 2(N-1)/N of the vector, or one gossip step's messages."""
    from course_lib.collectives.gossip import gossip_partners

    averagings = steps // period
    if averaging == "allreduce":
        return averagings * size * 2 * (world_size - 1) / world_size
    messages, s = 0, 1
    for _ in range(averagings):
        messages += len(set(gossip_partners(0, world_size, s)))  # one message when l = r
        s = s + 1 if s + 1 <= world_size // 2 else 1
    return messages * size


def my_regime_rate(
    compute_s: float, gradient_bytes: float, world_size: int, sync_share: float
) -> float:
    """Exercise 8.2: t_s from f = t_s / (t_s + t_c); the star moves 2(N-1) S through the server."""
    sync_s = compute_s * sync_share / (1 - sync_share)
    return 2 * (world_size - 1) * gradient_bytes / sync_s
