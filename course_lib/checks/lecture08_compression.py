"""Check for the exercise of lecture 8's section on source 000's gradient compression.

The student writes the link rate at which float32 synchronisation through source 000's star
takes a given share of each step (the "source's regime" of the re-measured Table 2); the check
compares it with :func:`course_lib.papers.source000_table.source_regime_rate` on several
clusters, and names the usual slip (counting only the workers' uploads, not the server's replies).
While the student's function runs, ``source_regime_rate`` refuses to
(:func:`course_lib.checks.verdict.refusing`): the lecture imports it to teach from it.
"""

from __future__ import annotations

from collections.abc import Callable

from course_lib.checks.verdict import Verdict, refusing, run_check
from course_lib.papers.source000_table import source_regime_rate

__all__ = ["REFUSED", "check_regime_rate", "one_hop_regime_rate", "stub_regime_rate"]

REFUSED = {  # the library function that answers the exercise, and what to write instead
    "course_lib.papers.source000_table.source_regime_rate": "solve f = t_s / (t_s + t_c) for "
    "t_s, then the star's 2(N-1) S / t_s",
}

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


def _body(fn: Callable) -> str:
    for compute_s, nbytes, n, share in CASES:
        with refusing(REFUSED, fn):
            got = float(fn(compute_s, nbytes, n, share))
        want = source_regime_rate(compute_s, nbytes, n, share)
        if abs(got - want) > 1e-6 * want:
            hint = ""
            if abs(got - want / 2) < 1e-6 * want:
                hint = (
                    ": half the right rate, as if only the uploads counted; the server "
                    "must also send the N-1 means back, after it has averaged"
                )
            raise AssertionError(
                f"t_c={compute_s} s, S={nbytes:g} B, N={n}, f={share:.3f}: got {got / 1e6:.3f} "
                f"MB/s, want {want / 1e6:.3f} MB/s{hint}"
            )
    return f"{len(CASES)} clusters, N = 2..8, shares 0.5..0.9"


def check_regime_rate(fn: Callable, *, exercise: str = "8.1", verbose: bool = True) -> Verdict:
    """Exercise: ``fn(compute_s, gradient_bytes, world_size, sync_share)`` -> bytes/s."""
    return run_check(exercise, "the source's regime", lambda: _body(fn), verbose=verbose)
