"""Instructor answers to lecture 10's exercises (notebooks/10_pipeline_parallel.ipynb)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["my_1f1b", "my_balance"]


def my_1f1b(num_stages: int, num_microbatches: int, stage: int) -> list[tuple[str, int]]:
    """Exercise 10.1: p - stage - 1 warm-up forwards, then one forward / one backward, then drain."""
    m = num_microbatches
    warm = min(num_stages - stage - 1, m)
    out = [("F", i) for i in range(warm)]
    forward, backward = warm, 0
    while forward < m:
        out += [("F", forward), ("B", backward)]
        forward, backward = forward + 1, backward + 1
    out += [("B", i) for i in range(backward, m)]
    return out


def my_balance(costs: Sequence[float], num_stages: int) -> list[tuple[int, int]]:
    """Exercise 10.2: dynamic programming over the last cut; the slowest stage is minimal."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: the cheapest slowest stage covering layers 0..i with k stages; cut: its start
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                worst = max(best[k - 1][j], prefix[i] - prefix[j])
                if worst < best[k][i]:
                    best[k][i], cut[k][i] = worst, j
    stages, stop = [], n
    for k in range(num_stages, 0, -1):
        start = cut[k][stop]
        stages.append((start, stop))
        stop = start
    return stages[::-1]
