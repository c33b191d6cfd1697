"""Check cells for lecture 0 (the cluster): run the student's function on real engines."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from course_lib.checks.verdict import Verdict, run_check

__all__ = ["check_sum_of_squares"]


def check_sum_of_squares(
    sum_of_squares_on_engines: Callable[[Any, int], int], view: Any, *, verbose: bool = True
) -> Verdict:
    """Exercise 0.1: the student's function must spread the work over ``view`` and sum correctly.

    The reference is the formula $\\sum_{i<N} i^2 = (N-1)N(2N-1)/6$, for three fixed $N$ and one
    random one (so a table of answers fails); the controller's task counts must show that every
    engine of ``view`` ran something during each call, so a function that quietly computes
    everything in the notebook fails.
    """

    def completed() -> dict[int, int]:
        status = view.client.queue_status()
        return {eid: status[eid]["completed"] for eid in view.targets}

    def settled_counts() -> dict[int, int]:
        """Counts once the previous call's late results are in (two equal reads in a row)."""
        counts, deadline = completed(), time.monotonic() + 2.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
            again = completed()
            if again == counts:
                break
            counts = again
        return counts

    def body() -> str:
        sizes = (10, 1001, 3, random.SystemRandom().randrange(2_000, 50_000))
        for N in sizes:
            before = settled_counts()
            got = sum_of_squares_on_engines(view, N)
            expected = (N - 1) * N * (2 * N - 1) // 6
            assert got == expected, f"N={N}: got {got!r}, expected {expected}"
            # the controller counts a task when it sees the result, a moment after the client
            # may: poll briefly before calling an engine idle
            deadline = time.monotonic() + 5.0
            while True:
                after = completed()
                idle = [rank for rank, eid in enumerate(view.targets) if after[eid] == before[eid]]
                if not idle or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert not idle, (
                f"N={N}: the right number, but the engines of ranks {idle} ran nothing; "
                "compute the squares there (scatter, then apply or execute)"
            )
        return f"{len(view)} engines, N in {sizes[:3]} and one random N"

    return run_check("0.1", "sum_of_squares_on_engines", body, verbose=verbose)
