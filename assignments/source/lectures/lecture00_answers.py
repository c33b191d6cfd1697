"""Instructor answer to lecture 0's exercise (notebooks/00_cluster.ipynb)."""

from __future__ import annotations

from typing import Any

__all__ = ["sum_of_squares_on_engines"]


def sum_of_squares_on_engines(view: Any, N: int) -> int:
    """Exercise 0.1: scatter range(N), sum the squares on every engine, add the partial sums."""
    view.scatter("part", range(N), block=True)
    view.execute("partial = sum(i * i for i in part)", block=True)
    return sum(view.pull("partial", block=True))
