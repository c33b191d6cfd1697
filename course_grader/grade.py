"""Grade submissions: the student's answer cells, run inside the instructor's pristine copy by nbval.

Only the answer cells' code is taken from a submission (a student's stored outputs are never
read). It is put into the instructor's source, whose check cells become *probes*
(:mod:`course_grader.verdict.probe`): they return the answers' results as data, and the grader
judges them in its own process with the assignment's own judges (``assignments/aN``, found by
:mod:`course_grader.registry`). The verdict is never the kernel's: nothing a kernel prints can
pass an exercise, and the kernel runs without the grader, the checks and the packages the
assignment forbids (torch in A1).

Before pasting, each answer cell is read with ``ast`` (:mod:`course_grader.verdict.guard`): one that
imports the grader or a forbidden package, or reaches into namespaces is not run, and its exercise
scores 0 with the reason.

A cell that hangs or kills its kernel makes nbval skip every later cell. When it is an answer or
a check, the grader re-runs the notebook with that exercise's answer replaced by its stub, so the
student loses the points of that exercise (and of exercises that use it) but not of the others.
When it is a set-up cell (starting engines, importing torch), the grading machine was too slow,
not the student: the notebook is re-run once with twice the cell limit, and if that fails too the
exercises that did not run say so.

Where the machine allows (Linux namespaces), each run's kernel and everything it starts run in
a sandbox (:mod:`course_grader.sandbox.config`) that shows them no solutions and lets them change
nothing outside a throwaway folder; elsewhere, the notebook runs unisolated and the gradebook
says so. Whatever a run leaves behind dies with the sandbox, or is killed by the run's mark
(:mod:`course_grader.runner`); nothing the kernel wrote is read.


Kept whole: one pipeline, ``grade_notebook``, read top to bottom; the helpers serve it alone.
"""

from __future__ import annotations

import copy
import re
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_grader.cells import (
    UNGRADED_HINT,
    answer_id,
    check_id,
    check_points,
    stub_solution,
)
from course_grader.registry import probe_spec
from course_grader.release import write_notebook_atomically
from course_grader.runner import run_nbval
from course_grader.sandbox.config import SandboxLimits, kit_package, sandbox_problem
from course_grader.verdict.guard import rejected_answers
from course_grader.verdict.probe import ProbeSpec, convert_notebook, judge
from course_lib.i18n import _, speaking

__all__ = [
    "ExerciseResult",
    "GradingLimits",
    "build_graded_notebook",
    "grade_notebook",
    "resolve_sandbox",
    "submission_language",
]


def resolve_sandbox(sandbox: SandboxLimits | None | str) -> SandboxLimits | None:
    """Turn "auto" into the default limits where a sandbox can be made here, else None."""
    if sandbox == "auto":
        return SandboxLimits() if sandbox_problem() is None else None
    if sandbox is not None and not isinstance(sandbox, SandboxLimits):
        raise ValueError(f"sandbox={sandbox!r}: use SandboxLimits(...), None or 'auto'")
    return sandbox


@dataclass(frozen=True)
class GradingLimits:
    """Time limits for one submission: per cell, and for the whole notebook run."""

    cell_seconds: float = 60.0
    total_seconds: float = 600.0

    def __post_init__(self) -> None:
        if self.cell_seconds <= 0 or self.total_seconds < self.cell_seconds:
            raise ValueError(
                f"limits {self.cell_seconds} s per cell, {self.total_seconds} s in total: use a "
                "positive cell limit and a total limit at least as long"
            )


@dataclass(frozen=True)
class ExerciseResult:
    """One row of the gradebook."""

    student: str
    assignment: str
    exercise: str
    points: float
    max_points: float
    reason: str


def build_graded_notebook(
    pristine: nbformat.NotebookNode,
    submission: nbformat.NotebookNode | None,
    stubbed: set[str] = frozenset(),
) -> nbformat.NotebookNode:
    """Return the pristine notebook with each answer cell's code taken from the submission.

    A missing answer (or an exercise in ``stubbed``) gets the stub, which fails its check.
    When a submission repeats an answer cell, the last copy counts (as it would in Jupyter).
    """
    answers = _submitted_answers(submission)
    graded = copy.deepcopy(pristine)
    for cell in graded.cells:
        exercise = answer_id(cell)
        if exercise is None:
            continue
        if exercise in answers and exercise not in stubbed:
            cell.source = answers[exercise]
        else:
            cell.source = stub_solution(cell.source, exercise, UNGRADED_HINT)
    return graded


def _submitted_answers(submission: nbformat.NotebookNode | None) -> dict[str, str]:
    """Return {exercise: code} of a submission's answer cells; the last copy of a cell counts."""
    answers: dict[str, str] = {}
    for cell in submission.cells if submission is not None else []:
        exercise = answer_id(cell)
        if exercise is not None and cell.get("cell_type") == "code":
            answers[exercise] = cell.source
    return answers


def _exercise_cells(nb: nbformat.NotebookNode) -> tuple[dict[int, str], dict[int, str]]:
    """Map nbval's code-cell numbers to exercises: (answer cells, check cells)."""
    answers, checks = {}, {}
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    for number, cell in enumerate(code_cells):
        if answer_id(cell) is not None:
            answers[number] = answer_id(cell)
        if check_id(cell) is not None:
            checks[number] = check_id(cell)
    return answers, checks


def _stuck_cell(results: dict[int, tuple[str, str]]) -> tuple[int | None, str]:
    """Return the number of the first cell that hung or killed the kernel, and why."""
    for number in sorted(results):
        outcome, message = results[number]
        if outcome in ("failure", "error") and (
            "Timeout of" in message or "Kernel died" in message
        ):
            return number, "timed out" if "Timeout of" in message else "crashed its kernel"
    return None, ""


def _captured(folder: Path) -> dict[int, tuple[str, dict | None]]:
    """Return {cell number: (stdout, wire)} of the probe cells, as nbval stored them (outside the sandbox)."""
    import json

    found = {}
    for path in folder.glob("probe-*.json"):
        try:
            record = json.loads(path.read_text())
            wire = record.get("wire")
            found[int(path.stem.removeprefix("probe-"))] = (
                str(record["stdout"]),
                wire if isinstance(wire, dict) else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            continue
    return found


def _reason(exercise: str, outcome: str, message: str) -> str:
    """Pull the student's verdict line (or the error) out of nbval's failure message."""
    if outcome == "passed":
        return _("PASS")
    for line in message.splitlines():  # nbval's diff shows the new line as "- Exercise ..."
        start = line.find(f"Exercise {exercise} ")
        if start >= 0 and ": FAIL" in line:
            verdict = line[start:].split(": ", 1)[1].strip()
            return re.sub(r"\s*\[[\d.]+/[\d.]+ points\]$", "", verdict)
    for line in reversed(message.splitlines()):
        if re.match(r"^\w+(Error|Exception)\b", line.strip()):
            return f"error: {line.strip()[:200]}"
    return _("the check did not print a PASS verdict")


def submission_language(
    submission: nbformat.NotebookNode | None, pristine: nbformat.NotebookNode
) -> str:
    """Return the language of a submission's reasons: its notebook's (a translated edition's), else the source's."""
    for nb in (submission, pristine):
        lang = nb.metadata.get("language") if nb is not None else None
        if isinstance(lang, str):
            return lang
    return "en"


def grade_notebook(
    student: str,
    assignment: str,
    pristine: nbformat.NotebookNode,
    submission: nbformat.NotebookNode | None,
    limits: GradingLimits,
    workdir: Path | None = None,
    sandbox: SandboxLimits | None | str = "auto",
    hidden: tuple[str, ...] = (),
    seed: int | None = None,
    spec: ProbeSpec | None = None,
) -> list[ExerciseResult]:
    """Grade one submission against its pristine source; return one result per exercise.

    ``sandbox``: the limits of the sandbox the kernel runs in; None runs it unisolated, and
    "auto" (the default) sandboxes with the default limits where this machine can. ``hidden``:
    paths the kernel must not see (it sees none outside the system, Python and the kit anyway).
    ``seed``: the inputs of a converted assignment's probes (default: a fresh one, so that no
    answer can hold the results for the notebook's own inputs). ``spec``: how its check cells
    are probed and judged (default: the assignment's folder, found by the registry). The reasons
    are in the submission's language (:func:`submission_language`); the points do not depend on it.
    """
    with speaking(submission_language(submission, pristine)):
        return _grade_notebook(
            student, assignment, pristine, submission, limits, workdir, sandbox, hidden, seed, spec
        )


def _grade_notebook(
    student: str,
    assignment: str,
    pristine: nbformat.NotebookNode,
    submission: nbformat.NotebookNode | None,
    limits: GradingLimits,
    workdir: Path | None,
    sandbox: SandboxLimits | None | str,
    hidden: tuple[str, ...],
    seed: int | None,
    spec: ProbeSpec | None,
) -> list[ExerciseResult]:
    sandbox = resolve_sandbox(sandbox)
    spec = spec if spec is not None else probe_spec(pristine)
    seed = secrets.randbelow(2**31) if seed is None else seed
    forbidden = tuple(pristine.metadata.get("course", {}).get("forbidden_imports", []))
    blocked = forbidden if spec.blocked else ()
    kit = spec.kit
    kit_hidden = tuple(str(kit_package().parent / part) for part in spec.kit_hidden)
    captured: dict[int, tuple[str, dict | None]] = {}
    answers, checks = _exercise_cells(pristine)
    points = {check_id(c): check_points(c) for c in pristine.cells if check_id(c) is not None}
    # exercise -> why its answer is not run
    stubbed = rejected_answers(pristine, _submitted_answers(submission))
    cell_limit = limits.cell_seconds
    slow_setup: tuple[int, str] | None = None  # (cell, reason) when a set-up cell failed twice
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="grade-", dir=workdir) as tmp:
        for run in range(len(points) + 2):  # each re-run stubs one more exercise, or retries once
            graded = convert_notebook(
                build_graded_notebook(pristine, submission, set(stubbed)), spec, seed
            )
            path = Path(tmp) / f"{assignment}_{run}.ipynb"
            write_notebook_atomically(graded, path)
            probes = Path(tmp) / f"probes_{run}"  # nbval writes here; the kernel never sees it
            probes.mkdir()
            remaining = limits.total_seconds - (time.monotonic() - started)
            if remaining <= 0:
                results = None
            else:
                results = run_nbval(
                    path,
                    min(cell_limit, remaining),
                    remaining,
                    sandbox=sandbox,
                    hidden=(*hidden, *kit_hidden),
                    blocked=blocked,
                    kit=kit,
                    probes=probes,
                    cut=spec.kit_cut,
                )
                captured = _captured(probes)
            if results is None:
                return [
                    ExerciseResult(
                        student,
                        assignment,
                        ex,
                        0.0,
                        points[ex],
                        _("the notebook passed the total time limit of {seconds} s").format(
                            seconds=f"{limits.total_seconds:g}"
                        ),
                    )
                    for ex in points
                ]
            number, why = _stuck_cell(results)
            if number is None:
                break
            stuck = answers.get(number) or checks.get(number)
            if stuck is not None:
                if stuck in stubbed:
                    break
                stubbed[stuck] = f"{why} (cell limit {cell_limit:g} s)"
                continue
            if not any(check > number for check in checks):
                break  # a tear-down cell (cluster.stop()): every check has run already
            # A set-up cell (starting engines, importing torch) is not the student's: when it
            # runs out of time, the grading machine is loaded. Once more, with twice the time.
            if cell_limit == limits.cell_seconds:
                cell_limit *= 2
                continue
            if why == "timed out":
                why = (
                    f"grading machine too slow: setup cell {number} exceeded {cell_limit:g} s; "
                    "re-run with a longer --cell-timeout"
                )
            else:
                why = f"grading machine failed: setup cell {number} crashed its kernel twice"
            slow_setup = (number, why)
            break
    rows = []
    answer_cells = {exercise: number for number, exercise in answers.items()}
    for number, exercise in checks.items():
        outcome, message = results.get(number, ("error", "the check cell did not run"))
        if exercise in stubbed:
            reason = stubbed[exercise]
        elif slow_setup is not None and number > slow_setup[0]:
            reason, outcome = slow_setup[1], "skipped"
        elif number in captured and outcome in ("passed", "failure"):
            passed, reason = judge(spec, exercise, seed, *captured[number])
            outcome = "passed" if passed else "failure"
            answer_outcome, answer_message = results.get(answer_cells.get(exercise, -1), ("", ""))
            if not passed and answer_outcome in ("failure", "error"):
                error = _reason(exercise, "error", answer_message)
                if error.startswith("error: "):
                    reason = _("the answer cell raised {error}").format(
                        error=error.removeprefix("error: ")
                    )
        else:
            if outcome == "passed":
                outcome = "failure"  # a probe that printed nothing the grader could read
            reason = _reason(exercise, outcome, message)
            answer_outcome, answer_message = results.get(answer_cells.get(exercise, -1), ("", ""))
            if outcome != "passed" and answer_outcome in ("failure", "error"):
                error = _reason(exercise, "error", answer_message)  # why the answer itself failed
                if error.startswith("error: "):
                    reason = _("the answer cell raised {error}").format(
                        error=error.removeprefix("error: ")
                    )
        got = points[exercise] if outcome == "passed" and exercise not in stubbed else 0.0
        rows.append(ExerciseResult(student, assignment, exercise, got, points[exercise], reason))
    return rows
