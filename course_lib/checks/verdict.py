"""Every lecture's and assignment's check cells print verdicts from here: one deterministic line per exercise, never a traceback.

Also the course's one guard against answers that delegate to the library (:func:`refusing`):
while a student's function runs, the library functions that answer the exercise raise
:class:`LibraryCall`, whatever name the notebook imported them under.
"""

from __future__ import annotations

import contextlib
import importlib
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from course_lib.i18n import _

__all__ = [
    "LibraryCall",
    "Verdict",
    "assert_close",
    "raise_as_in_the_notebook",
    "refusing",
    "reraise_stub",
    "run_check",
]


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
        status = _("PASS") if self.passed else _("FAIL")
        text = _("Exercise {exercise} {name}: {status}").format(
            exercise=self.exercise, name=self.name, status=status
        )
        if self.detail:
            text += f" ({self.detail})"
        if self.show_points:
            text += _(" [{points}/{max_points} points]").format(
                points=f"{self.points:g}", max_points=f"{self.max_points:g}"
            )
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
        verdict = Verdict(
            exercise,
            name,
            False,
            _("not implemented yet: {reason}").format(reason=_(str(exc))),  # a stub's hint
            0.0,
            top,
            show,
        )
    except AssertionError as exc:
        verdict = Verdict(exercise, name, False, str(exc) or _("wrong answer"), 0.0, top, show)
    except Exception as exc:  # noqa: BLE001 - a student's bug must become a verdict
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = _(" at line {line}").format(line=last.lineno) if last else ""
        verdict = Verdict(
            exercise, name, False, f"{type(exc).__name__}: {exc}{where}", 0.0, top, show
        )
    if verbose:
        print(verdict)
    return verdict


def reraise_stub(exc: BaseException) -> None:
    """Raise ``NotImplementedError`` when an engine's error is a stub's, so the verdict says so.

    ipyparallel wraps an engine's exception (``RemoteError``, or a ``CompositeError`` holding one
    per engine); a stub's ``NotImplementedError`` inside becomes ``FAIL (not implemented yet)``,
    and a :class:`LibraryCall` becomes the same refusal it is in the notebook's process.
    """
    errors = [(exc.ename, exc.evalue)] if hasattr(exc, "ename") else []
    errors += [(e[0], e[1]) for e in getattr(exc, "elist", [])]  # a CompositeError's
    for name, value in errors:
        if name == "NotImplementedError":
            raise NotImplementedError(value) from None
    for name, value in errors:
        if name == "LibraryCall":
            raise LibraryCall(value) from None
    marker = "LibraryCall: "  # errors that reached the controller as text (a failed run's)
    if marker in str(exc):
        message = str(exc).split(marker, 1)[1].splitlines()[0]
        raise LibraryCall(message.split("; rank ")[0]) from None  # one rank's is enough


def raise_as_in_the_notebook(exc: BaseException, stub_message: str) -> None:
    """Re-raise an engine check's wrapped error as the notebook's own check would raise it.

    A library call becomes its refusal, a stub's ``NotImplementedError`` becomes
    ``NotImplementedError(stub_message)`` (no answer in it), a failed assertion its message;
    anything else is re-raised as it came.
    """
    inner = getattr(exc, "ename", None)
    if inner == "LibraryCall" or "LibraryCall" in str(exc):
        reraise_stub(exc)  # the refusal, as in the notebook's process
    if inner == "NotImplementedError" or "NotImplementedError" in str(exc):
        raise NotImplementedError(stub_message) from None
    if inner == "AssertionError":
        raise AssertionError(getattr(exc, "evalue", str(exc))) from None
    raise exc


# ---- answers that delegate to the library ------------------------------------------------------
class LibraryCall(AssertionError):
    """A library function that answers the exercise was called by the student's function."""


def _resolve(dotted: str) -> Callable:
    """Import a dotted name under course_lib (``...module.Class.method``, ``...TABLE[key]``)."""
    path, _sep, key = dotted.partition("[")
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        if key:  # a function kept in a table, e.g. the cost model's ALGORITHMS[star_allreduce]
            obj = obj[key.rstrip("]")]
        return getattr(obj, "__func__", obj)  # a classmethod's function
    raise ImportError(f"cannot import {dotted}")


def _trap_code(message: str, free: int) -> object:
    """Code that raises ``LibraryCall(message)``, with ``free`` closure cells like its target's.

    Globals are looked up in the target's module, so the error class is imported by name
    through the builtins, which every module shares.
    """
    cells = [f"_c{i}" for i in range(free)]
    raise_line = (
        "raise __import__('course_lib.checks.verdict', fromlist=['LibraryCall'])"
        f".LibraryCall({message!r})"
    )
    source = "def _outer():\n"
    source += "".join(f"    {c} = None\n" for c in cells)
    source += "    def trap(*args, **kwargs):\n"
    source += "".join(f"        {c}\n" for c in cells)
    source += f"        {raise_line}\n"
    source += "    return trap\n"
    namespace: dict = {}
    exec(compile(source, "<library guard>", "exec"), namespace)  # noqa: S102 - our own text
    return namespace["_outer"]().__code__


@contextlib.contextmanager
def refusing(functions: Mapping[str, str], answer: Callable | None = None) -> Iterator[None]:
    """While the block runs, every library function in ``functions`` raises :class:`LibraryCall`.

    ``functions`` maps a dotted name (``"course_lib.collectives.ring_allgather"``, a method as
    ``"...StalenessLedger.may_proceed"``) to the hint that follows the refusal. The functions'
    ``__code__`` is swapped, not a module attribute, so every alias (``C.ring_allgather``, a
    ``from ... import``, a wrapper that calls it) is caught; the code is restored on the way out,
    also when the block raises. Give the student's function as ``answer`` to refuse the library
    function itself handed in as the answer (ipyparallel ships a function to an engine as a copy
    of its code, which the swap does not reach). Wrap only the student's call: the check's own
    reference runs outside the block.
    """
    swapped: list[tuple[Callable, object]] = []
    try:
        for dotted, hint in functions.items():
            fn = _resolve(dotted)
            message = _("your answer calls {name}, which answers the exercise: {hint}")
            message = message.format(name=dotted, hint=_(hint))  # hints are N_() in the tables
            if answer is not None and getattr(answer, "__code__", None) == fn.__code__:
                is_it = _("your answer is {name}, which answers the exercise: {hint}")
                raise LibraryCall(is_it.format(name=dotted, hint=_(hint)))
            swapped.append((fn, fn.__code__))
            fn.__code__ = _trap_code(message, len(fn.__closure__ or ()))
        yield
    finally:
        for fn, code in reversed(swapped):
            fn.__code__ = code


def assert_close(name: str, got: object, expected: np.ndarray, atol: float = 1e-8) -> None:
    """Assert that ``got`` has ``expected``'s shape and values, with a reason a student can use."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        raise AssertionError(
            _("{name} has shape {got}, expected {expected}").format(
                name=name, got=got.shape, expected=expected.shape
            )
        )
    if not np.allclose(got, expected, atol=atol, rtol=1e-6):
        err = float(np.abs(got - expected).max())
        raise AssertionError(
            _("{name} differs from the reference by up to {err}").format(
                name=name, err=f"{err:.3g}"
            )
        )
