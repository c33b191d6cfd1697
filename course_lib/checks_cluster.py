"""Check cells for lecture 0 (the cluster): run the student's function on real engines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.verdict import Verdict, run_check

__all__ = ["check_sum_of_squares"]


def check_sum_of_squares(
    sum_of_squares_on_engines: Callable[[Any, int], int], view: Any, *, verbose: bool = True
) -> Verdict:
    """Exercise 0.1: the student's function must spread the work over ``view`` and sum correctly.

    The reference is the formula $\\sum_{i<N} i^2 = (N-1)N(2N-1)/6$; the check also counts the
    messages the client sent, so a function that quietly computes everything in the notebook
    fails.
    """

    def body() -> str:
        sizes = (10, 1001, 3)
        for N in sizes:
            sent_before = len(view.client.history)
            got = sum_of_squares_on_engines(view, N)
            expected = (N - 1) * N * (2 * N - 1) // 6
            assert got == expected, f"N={N}: got {got!r}, expected {expected}"
            assert len(view.client.history) > sent_before, (
                f"N={N}: the right number, but nothing was sent to the engines; "
                "compute the squares there (scatter, then apply or execute)"
            )
        return f"{len(view)} engines, N in {sizes}"

    return run_check("0.1", "sum_of_squares_on_engines", body, verbose=verbose)
