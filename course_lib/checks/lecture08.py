"""Checks for the exercises of lecture 8 (reproducing the papers).

Exercise 8.1 compares the student's prediction of the values one rank sends under source 001's
dense configurations (Local-SGD(p) with allreduce or with gossip) with
:func:`~course_lib.papers.source001_configurations.predict_values_sent`, for world sizes 2..8 (where
gossip's two partners coincide at s = P/2), periods 1..32 and step counts that do and do not
divide by the period. The notebook then holds the same prediction against the measured rows.
While the student's function runs, ``predict_values_sent`` refuses to
(:func:`course_lib.checks.verdict.refusing`): the lecture imports it to teach from it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from course_lib.checks.verdict import Verdict, refusing, run_check
from course_lib.papers.source001_configurations import predict_values_sent

__all__ = [
    "REFUSED",
    "check_values_sent",
    "stub_values_sent",
    "two_messages_values_sent",
]

REFUSED = {  # the library function that answers the exercise, and what to write instead
    "course_lib.papers.source001_configurations.predict_values_sent": "count the averagings "
    "(steps // period) and the values each sends, with gossip_partners for gossip",
}


# ---- Exercise 8.1: predict the values sent ------------------------------------------------------
def stub_values_sent(averaging: str, size: int, world_size: int, steps: int, period: int) -> float:
    """The released stub of Exercise 8.1."""
    raise NotImplementedError("Exercise 8.1: predict the values one rank sends")


def two_messages_values_sent(
    averaging: str, size: int, world_size: int, steps: int, period: int
) -> float:
    """A tempting mistake: every gossip step sends two messages, even when l = r."""
    syncs = steps // period
    if averaging == "allreduce":
        return syncs * size * 2 * (world_size - 1) / world_size
    return 2.0 * syncs * size


def _cases() -> list[tuple[str, int, int, int, int]]:
    return [
        (averaging, size, n, steps, period)
        for averaging in ("allreduce", "gossip")
        for n in (2, 3, 4, 5, 8)
        for steps, period in ((92, 1), (92, 4), (92, 16), (100, 32), (7, 1))
        for size in (9610,)
    ]


def _values_sent_body(fn: Callable) -> str:
    cases = _cases()
    for averaging, size, n, steps, period in cases:
        with refusing(REFUSED, fn):
            got = float(fn(averaging, size, n, steps, period))
        want = predict_values_sent(averaging, size, n, steps, period)
        if not np.isclose(got, want, rtol=1e-9):
            hint = ""
            if averaging == "allreduce":
                hint = (
                    " (a ring allreduce moves 2(N-1)/N of the vector per rank, once per "
                    "period: steps // period times)"
                )
            elif n % 2 == 0:
                hint = (
                    " (at s = P/2 both partners are the same rank: one message, not two; "
                    "the distance moves on only at the steps that gossip)"
                )
            raise AssertionError(
                f"{averaging}, P={n}, {steps} steps, period {period}: got {got:.0f} values, "
                f"want {want:.0f}{hint}"
            )
    return f"{len(cases)} cases: allreduce and gossip, P = 2..8, periods 1..32"


def check_values_sent(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 8.1: ``fn(averaging, size, world_size, steps, period)`` against the library."""
    return run_check("8.1", "values sent", lambda: _values_sent_body(fn), verbose=verbose)
