"""Checks for the exercises of lecture 8 (reproducing the papers): 8.1 source 001, 8.2 source 000.

Exercise 8.1 compares the student's prediction of the values one rank sends under source 001's
dense configurations (Local-SGD(p) with allreduce or with gossip) with
:func:`~course_lib.papers.source001_configurations.predict_values_sent`, for world sizes 2..8 (where
gossip's two partners coincide at s = P/2), periods 1..32 and step counts that do and do not
divide by the period. The notebook then holds the same prediction against the measured rows.
While the student's function runs, ``predict_values_sent`` refuses to
(:func:`course_lib.checks.verdict.refusing`): the lecture imports it to teach from it.

Exercise 8.2 (the section on source 000's gradient compression): the link rate at which float32
synchronisation through source 000's star takes a given share of each step (the "source's
regime" of the re-measured Table 2), compared with
:func:`course_lib.papers.source000_table.source_regime_rate` on several clusters, naming the
usual slip (counting only the workers' uploads, not the server's replies); that function refuses
to run while the student's does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from course_lib.checks.verdict import Verdict, refusing, run_check
from course_lib.i18n import N_, _
from course_lib.papers.source000_table import source_regime_rate
from course_lib.papers.source001_configurations import predict_values_sent

__all__ = [
    "REFUSED",
    "check_regime_rate",
    "check_values_sent",
    "one_hop_regime_rate",
    "stub_regime_rate",
    "two_messages_values_sent",
]

REFUSED = {  # the library function that answers the exercise, and what to write instead
    "course_lib.papers.source001_configurations.predict_values_sent": N_(
        "count the averagings "
        "(steps // period) and the values each sends, with gossip_partners for gossip"
    ),
    "course_lib.papers.source000_table.source_regime_rate": N_(
        "solve f = t_s / (t_s + t_c) for t_s, then the star's 2(N-1) S / t_s"
    ),
}


# ---- Exercise 8.1: predict the values sent ------------------------------------------------------
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
                hint = _(
                    " (a ring allreduce moves 2(N-1)/N of the vector per rank, once per "
                    "period: steps // period times)"
                )
            elif n % 2 == 0:
                hint = _(
                    " (at s = P/2 both partners are the same rank: one message, not two; "
                    "the distance moves on only at the steps that gossip)"
                )
            raise AssertionError(
                _(
                    "{averaging}, P={n}, {steps} steps, period {period}: got {got} values, "
                    "want {want}{hint}"
                ).format(
                    averaging=averaging,
                    n=n,
                    steps=steps,
                    period=period,
                    got=f"{got:.0f}",
                    want=f"{want:.0f}",
                    hint=hint,
                )
            )
    return _("{n} cases: allreduce and gossip, P = 2..8, periods 1..32").format(n=len(cases))


def check_values_sent(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 8.1: ``fn(averaging, size, world_size, steps, period)`` against the library."""
    return run_check("8.1", "values sent", lambda: _values_sent_body(fn), verbose=verbose)


# ---- Exercise 8.2: the source's regime -------------------------------------------------------
CASES = [(0.4, 7.8e6, 4, 68.7 / 96.996), (2.0, 8.33e6, 6, 68.7 / 96.996), (0.1, 1e6, 2, 0.5),
         (0.05, 3e5, 8, 0.9)]  # fmt: skip


def stub_regime_rate(
    compute_s: float, gradient_bytes: float, world_size: int, sync_share: float
) -> float:
    """The released stub."""
    raise NotImplementedError("return B = ... from t_s = t_c f / (1 - f) and the star's t_s")


def one_hop_regime_rate(
    compute_s: float, gradient_bytes: float, world_size: int, sync_share: float
) -> float:
    """A wrong answer: only the N-1 uploads are counted, not the server's N-1 replies."""
    return (world_size - 1) * gradient_bytes * (1 - sync_share) / (sync_share * compute_s)


def _regime_body(fn: Callable) -> str:
    for compute_s, nbytes, n, share in CASES:
        with refusing(REFUSED, fn):
            got = float(fn(compute_s, nbytes, n, share))
        want = source_regime_rate(compute_s, nbytes, n, share)
        if abs(got - want) > 1e-6 * want:
            hint = ""
            if abs(got - want / 2) < 1e-6 * want:
                hint = _(
                    ": half the right rate, as if only the uploads counted; the server "
                    "must also send the N-1 means back, after it has averaged"
                )
            raise AssertionError(
                _(
                    "t_c={compute} s, S={nbytes} B, N={n}, f={share}: got {got} MB/s, "
                    "want {want} MB/s{hint}"
                ).format(
                    compute=compute_s,
                    nbytes=f"{nbytes:g}",
                    n=n,
                    share=f"{share:.3f}",
                    got=f"{got / 1e6:.3f}",
                    want=f"{want / 1e6:.3f}",
                    hint=hint,
                )
            )
    return _("{n} clusters, N = 2..8, shares 0.5..0.9").format(n=len(CASES))


def check_regime_rate(fn: Callable, *, exercise: str = "8.1", verbose: bool = True) -> Verdict:
    """Exercise: ``fn(compute_s, gradient_bytes, world_size, sync_share)`` -> bytes/s."""
    return run_check(exercise, "the source's regime", lambda: _regime_body(fn), verbose=verbose)
