"""No lecture (the grader). The verdict out of the answer's reach: the kernel returns data, the grader decides.

For every assignment (each found by :mod:`course_grader.registry`), the grader replaces each check cell
of the graded copy with a *probe* cell: it calls the student's function on inputs the grader
chose (a fresh seed per grading) and prints the results as one line of JSON, arrays inside as
``.npy`` bytes (``np.save(allow_pickle=False)``). nbval, outside the sandbox, stores that line
(:mod:`course_grader.sandbox.nbval_ipc`); the grader decodes it with ``allow_pickle=False`` and
runs the assignment's own check in its own process, on its own copy of the inputs, with its
reference (torch) that the kernel cannot even import. Whatever an answer does inside the
kernel (rebinding ``print`` or ``Verdict``, walking frames, patching NumPy) changes at most the
data it returns, and only the right numbers pass.
"""

from __future__ import annotations

import base64
import builtins
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nbformat
import numpy as np

from course_grader.cells import answer_id, check_id
from course_grader.verdict.claims import PER_PAIR, Claims
from course_grader.verdict.kernel_data import decode_value, marked_json
from course_grader.verdict.wire import PIDS_CODE, wire_problem
from course_lib.checks.verdict import Verdict
from course_lib.i18n import N_, _

__all__ = [
    "UNJUDGED",
    "ExerciseProbe",
    "ProbeSpec",
    "convert_notebook",
    "decode_results",
    "encode_cases",
    "judge",
    "probe_source",
]

MARK = "COURSE-PROBE:"
#: The reason's start when the grader itself failed on an answer's data: the answer gets 0.
UNJUDGED = N_("the grader could not judge this answer")

# The kernel's half: decode the grader's inputs, call the answer, print the results as data.
# It runs in the student's kernel, so the student can change it; that changes only the data.
_KERNEL_CODE = """\
# The grader's probe for {exercise}: it calls your function on the grader's inputs and
# prints the results; the grader checks them outside this kernel.
def _course_probe():
    import base64, io, json, traceback
    import numpy as np

    def dec(v):
        if isinstance(v, dict) and "npy" in v:
            return np.load(io.BytesIO(base64.b64decode(v["npy"])), allow_pickle=False)
        if isinstance(v, dict):
            return {{k: dec(x) for k, x in v.items()}}
        return [dec(x) for x in v] if isinstance(v, list) else v

    def enc(x):
        if isinstance(x, (tuple, list)):
            return {{type(x).__name__: [enc(v) for v in x]}}
        if x is None:
            return {{"none": 1}}
        if isinstance(x, str):
            return {{"str": x[:200]}}
        try:
            a = np.asarray(x)
        except Exception:
            a = None
        if a is None or a.dtype.kind not in "biufc":
            return {{"type": type(x).__name__}}
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=False)
        return {{"npy": base64.b64encode(buf.getvalue()).decode()}}

{setup}
    out = []
    for case in dec(json.loads(base64.b64decode("{cases}"))):
        try:
            out.append({{"value": enc({call})}})
        except Exception as exc:
            tb = traceback.extract_tb(exc.__traceback__)
            name, message = type(exc).__name__, str(exc)
            remote = [(exc.ename, exc.evalue)] if hasattr(exc, "ename") else []
            for ename, evalue in remote + [e[:2] for e in getattr(exc, "elist", [])]:
                if ename == "NotImplementedError":  # a stub's, raised on an engine
                    name, message = ename, str(evalue)
            out.append({{"error": name, "message": message[:300],
                        "line": tb[-1].lineno if tb else 0}})
            break  # the check stops at the first failure: spare the later cases' time
    print("{mark}" + json.dumps(out))
{pids}

_course_probe()
del _course_probe
"""


@dataclass(frozen=True)
class ExerciseProbe:
    """One exercise: its inputs, the call the kernel makes, and the grader's check."""

    inputs: Callable[[int], list[dict]]  # seed -> cases (arrays and numbers only)
    call: str  # a Python expression over ``case`` calling the answer
    check: Callable[..., Verdict]  # check(replayed_answer, verbose=False, seed=seed)
    setup: str = ""  # kernel code defined before the calls (indented 4)
    # results -> what the ranks reported, summed over the cases, as :mod:`.claims` models it (one
    # set, or one per direction gloo's rings could take): held against the bytes on the wire
    claims: Callable[[list], Claims | list[Claims]] | None = None
    wire_slack: int = PER_PAIR  # bytes a pair may carry beyond them (subgroups made, ...)


@dataclass(frozen=True)
class ProbeSpec:
    """An assignment whose verdicts the grader decides: its kernel set-up and exercises."""

    kernel_setup: str  # replaces the set-up cell that imported the checks ("" keeps it)
    exercises: dict[str, ExerciseProbe]
    blocked: bool = True  # the kernel cannot import the assignment's forbidden packages
    kit: bool = False  # the kernel sees course_lib (its engines need the communicators)...
    # ...but not these parts, as paths under the checkout (the references, the whole grader)
    kit_hidden: tuple[str, ...] = ("course_lib/checks", "course_grader")
    # ...and these functions of the kit only as stubs: what the assignment asks the student to
    # write, "module:function" or "module:Class.method" (course_grader.sandbox.kit_cut)
    kit_cut: tuple[str, ...] = ()


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return {"npy": base64.b64encode(buf.getvalue()).decode()}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def encode_cases(cases: list[dict]) -> str:
    """The cases as base64 of JSON (arrays as ``.npy``): a literal the probe cell decodes."""
    return base64.b64encode(json.dumps(_encode(cases)).encode()).decode()


def probe_source(probe: ExerciseProbe, exercise: str, seed: int) -> str:
    """The probe cell's code for ``exercise`` on the grader's ``seed`` (what the kernel runs)."""
    return _KERNEL_CODE.format(
        exercise=exercise,
        setup=probe.setup,
        call=probe.call,
        mark=MARK,
        cases=encode_cases(probe.inputs(seed)),
        pids=PIDS_CODE if probe.claims is not None else "",
    )


def convert_notebook(
    graded: nbformat.NotebookNode, spec: ProbeSpec, seed: int
) -> nbformat.NotebookNode:
    """Replace the check cells with probe cells, the checks' import with the kernel set-up."""
    setup_done = False
    for cell in graded.cells:
        if cell.cell_type != "code" or answer_id(cell) is not None:
            continue
        exercise = check_id(cell)
        if exercise is not None:
            probe = spec.exercises[exercise]
            cell.source = probe_source(probe, exercise, seed)
            cell.metadata.setdefault("course", {})["probe"] = exercise
            cell.outputs = []
        elif _imports_the_checks(cell.source) and spec.kernel_setup:
            cell.source = "" if setup_done else spec.kernel_setup
            setup_done = True
    return graded


def _imports_the_checks(source: str) -> bool:
    """Whether a set-up cell imports the assignment's checks (the grader's or the lectures')."""
    return "course_grader" in source or "course_lib.checks" in source


def decode_results(stdout: str) -> list[dict] | None:
    """Return the probe's per-case results from its printed line, or None when there is none.

    A line that is not safe data (nested too deep, too long, non-finite numbers) raises
    :class:`~course_grader.verdict.kernel_data.KernelDataError`.
    """
    results = marked_json(stdout, MARK)
    return results if isinstance(results, list) else None


def _exception(result: dict) -> BaseException:
    """Rebuild the answer's exception as data: a builtin type of that name, else a new one."""
    name = str(result.get("error", "Exception"))[:60]
    message = str(result.get("message", ""))[:300]
    found = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(found, type) and issubclass(found, Exception):
        try:
            return found(message)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError takes 5 arguments
            pass
    safe = name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else "Exception"
    return type(safe, (Exception,), {})(message)


def _raise_at(exc: BaseException, line: int) -> None:
    """Raise ``exc`` from line ``line`` of ``<answer>``, so the verdict names the answer's line."""
    line = min(max(int(line), 1), 100_000)
    exec(compile("\n" * (line - 1) + "raise exc", "<answer>", "exec"), {"exc": exc})  # noqa: S102


def _replay(results: list) -> Callable:
    """An answer that returns (or raises) the kernel's results, call after call, in order."""
    calls = iter(results)

    def answer(*_args: Any, **_kwargs: Any) -> Any:
        result = next(calls, None)
        if not isinstance(result, dict):
            raise AssertionError("the answer returned no result for this case")
        if "error" in result:
            line = result.get("line")
            _raise_at(_exception(result), line if isinstance(line, int) else 0)
        return decode_value(result.get("value"))

    return answer


def _claims(probe: ExerciseProbe, results: list) -> Claims | list[Claims] | str:
    """What the ranks reported sending, or why their reports cannot be checked."""
    try:
        return probe.claims([decode_value(r.get("value")) for r in results if isinstance(r, dict)])
    except ValueError as exc:  # the claims' own checks: negative, unknown, self-contradicting
        return f"the ranks' byte counts cannot be checked: {str(exc)[:200]}"
    except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - from the kernel
        return f"the ranks' byte counts are not data ({type(exc).__name__})"


def judge(
    spec: ProbeSpec,
    exercise: str,
    seed: int,
    stdout: str | None,
    wire: dict | None = None,
) -> tuple[bool, str]:
    """Decide an exercise from its probe's output: (passed, reason), in the grader's process.

    ``wire``: the bytes nbval saw between the sandbox's processes during the probe (None when
    not audited); an exercise that reports its bytes passes only if they agree with it. Whatever
    the kernel printed, this returns: data the grader cannot read or judge fails the exercise
    with the reason (:data:`UNJUDGED`), never the grading of the class.
    """
    try:
        return _judge(spec, exercise, seed, stdout, wire)
    except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - the student's data
        why = f"{_(UNJUDGED)}: {type(exc).__name__}: {str(exc)[:200]}"
        return False, _("FAIL ({reason})").format(reason=why)


def _judge(spec, exercise, seed, stdout, wire) -> tuple[bool, str]:
    results = decode_results(stdout or "")
    if results is None:
        why = _("the answer's results never reached the grader")
        return False, _("FAIL ({reason})").format(reason=why)
    probe = spec.exercises[exercise]
    verdict = probe.check(_replay(results), verbose=False, seed=seed)
    if not verdict.passed:
        return False, _("FAIL ({reason})").format(reason=verdict.detail)
    if probe.claims is not None and wire is not None:
        claims = _claims(probe, results)
        problem = claims if isinstance(claims, str) else None
        problem = problem or wire_problem(claims, wire, stdout or "", probe.wire_slack)
        if problem:
            return False, _("FAIL ({reason})").format(reason=problem)
    return True, _("PASS")
