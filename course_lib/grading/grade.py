"""Grade submissions: the student's answer cells, run inside the instructor's pristine copy by nbval.

nbval compares a notebook with the outputs stored *in that notebook*; graded on its own, a
student's copy with its outputs edited to say PASS would pass. So only the answer cells' code is
taken from a submission. It is put into the instructor's source, whose check cells store the
expected PASS verdicts, and nbval re-executes that notebook: a check cell passes only if the
student's code reproduces the PASS line now.

A cell that hangs or kills its kernel makes nbval skip every later cell. The grader then
re-runs the notebook with that exercise's answer replaced by its stub, so the student loses the
points of that exercise (and of exercises that use it) but not of the others.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_lib.grading.cells import answer_id, check_id, check_points, stub_solution
from course_lib.grading.release import write_notebook_atomically

__all__ = ["ExerciseResult", "GradingLimits", "build_graded_notebook", "grade_notebook"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m|#x1B\[[0-9;]*m")


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
    answers: dict[str, str] = {}
    for cell in submission.cells if submission is not None else []:
        exercise = answer_id(cell)
        if exercise is not None and cell.get("cell_type") == "code":
            answers[exercise] = cell.source
    graded = copy.deepcopy(pristine)
    for cell in graded.cells:
        exercise = answer_id(cell)
        if exercise is None:
            continue
        if exercise in answers and exercise not in stubbed:
            cell.source = answers[exercise]
        else:
            cell.source = stub_solution(cell.source, exercise, "no answer was graded")
    return graded


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


def _run_nbval(path: Path, limits: GradingLimits) -> dict[int, tuple[str, str]] | None:
    """Run nbval on ``path``; return {cell number: (outcome, message)}, or None past the limit."""
    xml = path.with_suffix(".xml")
    cmd = [
        sys.executable, "-m", "pytest", str(path), "--nbval-lax",
        f"--nbval-cell-timeout={limits.cell_seconds:g}", "-p", "no:cacheprovider",
        "-q", f"--junitxml={xml}", "-o", "addopts=", "--rootdir", str(path.parent),
    ]  # fmt: skip
    # A session of its own, so that on the total time limit the kernel and whatever the
    # student's code started go down with pytest.
    proc = subprocess.Popen(
        cmd, cwd=path.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        proc.wait(timeout=limits.total_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None
    if not xml.exists():
        return {}
    results = {}
    for case in ET.parse(xml).iter("testcase"):
        match = re.search(r"Cell (\d+)", case.get("name", ""))
        if not match:
            continue
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                message = _ANSI.sub("", (child.get("message") or "") + "\n" + (child.text or ""))
        results[int(match[1])] = (outcome, message)
    return results


def _stuck_exercise(
    results: dict[int, tuple[str, str]], answers: dict[int, str], checks: dict[int, str]
) -> tuple[str | None, str]:
    """Return the exercise whose cell hung or killed the kernel, and why; (None, "") if none."""
    for number in sorted(results):
        outcome, message = results[number]
        if outcome in ("failure", "error") and (
            "Timeout of" in message or "Kernel died" in message
        ):
            why = "timed out" if "Timeout of" in message else "crashed its kernel"
            return answers.get(number) or checks.get(number), why
    return None, ""


def _reason(exercise: str, outcome: str, message: str) -> str:
    """Pull the student's verdict line (or the error) out of nbval's failure message."""
    if outcome == "passed":
        return "PASS"
    for line in message.splitlines():  # nbval's diff shows the new line as "- Exercise ..."
        start = line.find(f"Exercise {exercise} ")
        if start >= 0 and ": FAIL" in line:
            verdict = line[start:].split(": ", 1)[1].strip()
            return re.sub(r"\s*\[[\d.]+/[\d.]+ points\]$", "", verdict)
    for line in reversed(message.splitlines()):
        if re.match(r"^\w+(Error|Exception)\b", line.strip()):
            return f"error: {line.strip()[:200]}"
    return "the check did not print a PASS verdict"


def grade_notebook(
    student: str,
    assignment: str,
    pristine: nbformat.NotebookNode,
    submission: nbformat.NotebookNode | None,
    limits: GradingLimits,
    workdir: Path | None = None,
) -> list[ExerciseResult]:
    """Grade one submission against its pristine source; return one result per exercise."""
    answers, checks = _exercise_cells(pristine)
    points = {check_id(c): check_points(c) for c in pristine.cells if check_id(c) is not None}
    stubbed: dict[str, str] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="grade-", dir=workdir) as tmp:
        while True:
            graded = build_graded_notebook(pristine, submission, set(stubbed))
            path = Path(tmp) / f"{assignment}_{len(stubbed)}.ipynb"
            write_notebook_atomically(graded, path)
            remaining = limits.total_seconds - (time.monotonic() - started)
            if remaining <= 0:
                results = None
            else:
                cell_limit = min(limits.cell_seconds, remaining)
                results = _run_nbval(path, GradingLimits(cell_limit, remaining))
            if results is None:
                return [
                    ExerciseResult(
                        student,
                        assignment,
                        ex,
                        0.0,
                        points[ex],
                        f"the notebook passed the total time limit of {limits.total_seconds:g} s",
                    )  # fmt: skip
                    for ex in points
                ]
            stuck, why = _stuck_exercise(results, answers, checks)
            if stuck is None or stuck in stubbed:
                break
            stubbed[stuck] = f"{why} (cell limit {limits.cell_seconds:g} s)"
    rows = []
    for number, exercise in checks.items():
        outcome, message = results.get(number, ("error", "the check cell did not run"))
        if exercise in stubbed:
            reason = stubbed[exercise]
        else:
            reason = _reason(exercise, outcome, message)
        got = points[exercise] if outcome == "passed" and exercise not in stubbed else 0.0
        rows.append(ExerciseResult(student, assignment, exercise, got, points[exercise], reason))
    return rows
