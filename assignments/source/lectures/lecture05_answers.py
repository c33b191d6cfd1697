"""Instructor answers to lecture 5's exercises (notebooks/05_synchronisation.ipynb)."""

from __future__ import annotations

__all__ = ["my_may_proceed", "my_staleness"]


def my_staleness(order: list[int], workers: int) -> list[int]:
    """Exercise 5.1: updates applied since the worker last read; it reads right after its push."""
    version, read = 0, dict.fromkeys(range(1, workers + 1), 0)
    out = []
    for w in order:
        out.append(version - read[w])
        version += 1
        read[w] = version
    return out


def my_may_proceed(clocks: dict[int, int], live: set[int], worker: int, bound: int | None) -> bool:
    """Exercise 5.2: go when at most ``bound`` clocks ahead of the slowest live worker."""
    if bound is None:
        return True
    return clocks[worker] - min(clocks[w] for w in live) <= bound
