"""Verdicts for exercise check cells: one deterministic line per exercise, never a traceback."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Verdict", "assert_close", "reraise_stub", "run_check"]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one exercise check; prints as ``Exercise 1.2 name: PASS (detail)``."""

    exercise: str
    name: str
    passed: bool
    detail: str = ""
    points: float = 0.0
    max_points: float = 1.0
    show_points: bool = False  # graded assignments print "[2/2 points]"

    def __str__(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        text = f"Exercise {self.exercise} {self.name}: {status}"
        if self.detail:
            text += f" ({self.detail})"
        if self.show_points:
            text += f" [{self.points:g}/{self.max_points:g} points]"
        return text

    def __bool__(self) -> bool:
        return self.passed

    def _repr_pretty_(self, p, cycle) -> None:  # IPython shows the verdict line, not a dataclass
        p.text(str(self))


def run_check(
    exercise: str,
    name: str,
    body: Callable[[], str],
    *,
    max_points: float | None = None,
    verbose: bool = True,
) -> Verdict:
    """Run ``body`` and turn its outcome into a verdict; print it when ``verbose``.

    ``body`` returns a short detail string when the student's answer is right and raises
    ``AssertionError`` (with the reason) when it is wrong. A stub that raises
    ``NotImplementedError`` gives ``FAIL (not implemented yet: ...)``; any other exception
    gives ``FAIL`` with its type and message, so a check cell never stops a notebook.
    Giving ``max_points`` (graded assignments) adds ``[points/max_points points]`` to the line.
    """
    show = max_points is not None
    top = max_points if max_points is not None else 1.0
    try:
        detail = body() or ""
        verdict = Verdict(exercise, name, True, detail, top, top, show)
    except NotImplementedError as exc:
        verdict = Verdict(exercise, name, False, f"not implemented yet: {exc}", 0.0, top, show)
    except AssertionError as exc:
        verdict = Verdict(exercise, name, False, str(exc) or "wrong answer", 0.0, top, show)
    except Exception as exc:  # noqa: BLE001 - a student's bug must become a verdict
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f" at line {last.lineno}" if last else ""
        verdict = Verdict(
            exercise, name, False, f"{type(exc).__name__}: {exc}{where}", 0.0, top, show
        )
    if verbose:
        print(verdict)
    return verdict


def reraise_stub(exc: BaseException) -> None:
    """Raise ``NotImplementedError`` when an engine's error is a stub's, so the verdict says so.

    ipyparallel wraps an engine's exception (``RemoteError``, or a ``CompositeError`` holding one
    per engine); a stub's ``NotImplementedError`` inside becomes ``FAIL (not implemented yet)``.
    """
    errors = [(exc.ename, exc.evalue)] if hasattr(exc, "ename") else []
    errors += [(e[0], e[1]) for e in getattr(exc, "elist", [])]  # a CompositeError's
    for name, value in errors:
        if name == "NotImplementedError":
            raise NotImplementedError(value) from None


def assert_close(name: str, got: object, expected: np.ndarray, atol: float = 1e-8) -> None:
    """Assert that ``got`` has ``expected``'s shape and values, with a reason a student can use."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        raise AssertionError(f"{name} has shape {got.shape}, expected {expected.shape}")
    if not np.allclose(got, expected, atol=atol, rtol=1e-6):
        err = float(np.abs(got - expected).max())
        raise AssertionError(f"{name} differs from the reference by up to {err:.3g}")
