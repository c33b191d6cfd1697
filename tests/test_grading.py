"""Release and grading, end to end: real kernels under nbval, real engines for A2."""

from __future__ import annotations

import copy
import csv
import re
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import (
    GradingLimits,
    answer_id,
    check_id,
    grade_folder,
    grade_notebook,
    release_notebook,
    stub_solution,
    write_feedback,
    write_gradebook,
)
from course_lib.grading.cells import BEGIN, END

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "assignments" / "source"
RELEASED = ROOT / "notebooks" / "assignments"
LIMITS = GradingLimits(cell_seconds=20, total_seconds=300)
A1_FULL = {"A1.1": 2.0, "A1.2": 3.0, "A1.3": 3.0}
A2_FULL = {"A2.1": 3.0, "A2.2": 2.0, "A2.3": 3.0}


def _source(name: str) -> nbformat.NotebookNode:
    return nbformat.read(SOURCES / f"{name}.ipynb", as_version=4)


def _released(name: str) -> nbformat.NotebookNode:
    return nbformat.read(RELEASED / f"{name}.ipynb", as_version=4)


def _with_answer(nb: nbformat.NotebookNode, exercise: str, code: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if answer_id(cell) == exercise:
            cell.source = code
    return nb


def _points(rows) -> dict[str, float]:
    return {row.exercise: row.points for row in rows}


def _solutions(nb: nbformat.NotebookNode) -> list[str]:
    """Return the code lines inside every solution region of a source notebook."""
    lines = []
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            if BEGIN in line:
                inside = True
            elif END in line:
                inside = False
            elif inside and line.strip():
                lines.append(line.strip())
    return lines


# -- release -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["A1_sgd_conv", "A2_ring_allreduce"])
def test_released_notebooks_are_up_to_date_and_hold_no_solution(name):
    source = _source(name)
    fresh = release_notebook(source, source.metadata["course"]["assignment"])
    committed = _released(name)
    assert [c.source for c in committed.cells] == [c.source for c in fresh.cells], (
        "notebooks/assignments is stale: run ./kit release"
    )
    text = nbformat.writes(committed)
    assert BEGIN not in text and END not in text
    solution_lines = _solutions(source)
    assert len(solution_lines) >= 3
    code = "\n".join(c.source for c in committed.cells if c.cell_type == "code")
    leaked = [line for line in solution_lines if len(line) > 12 and line in code]
    assert not leaked, f"solution code in the released notebook: {leaked}"
    for cell in committed.cells:
        if answer_id(cell):
            assert f'raise NotImplementedError("Exercise {answer_id(cell)}: ' in cell.source
        if cell.cell_type == "code":
            assert cell.outputs == [] and "NBVAL_CHECK_OUTPUT" not in cell.source


def test_stub_keeps_indentation_and_refuses_unbalanced_markers():
    source = f"def f(x):\n    y = 1\n    {BEGIN}\n    return x + y\n    {END}\n"
    stub = stub_solution(source, "9.9", 'add "y"')
    assert stub == "def f(x):\n    y = 1\n    raise NotImplementedError(\"Exercise 9.9: add 'y'\")"
    compile(stub, "<stub>", "exec")
    with pytest.raises(ValueError, match="unbalanced solution markers"):
        stub_solution(f"{BEGIN}\nx = 1\n", "9.9", "hint")


# -- grading A1 (kernels only) -------------------------------------------------------------------


def test_instructor_source_a1_gets_full_points():
    rows = grade_notebook("teacher", "A1", _source("A1_sgd_conv"), _source("A1_sgd_conv"), LIMITS)
    assert _points(rows) == A1_FULL
    assert all(row.reason == "PASS" for row in rows)


def test_released_stub_a1_fails_every_check():
    rows = grade_notebook("blank", "A1", _source("A1_sgd_conv"), _released("A1_sgd_conv"), LIMITS)
    assert _points(rows) == dict.fromkeys(A1_FULL, 0.0)
    assert all(row.reason.startswith("FAIL (not implemented yet: Exercise A1.") for row in rows)


WRONG_MEAN = """
def sgd_step(W, b, X, y, lr):
    Z = X @ W + b
    P = np.exp(Z - Z.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    P[np.arange(len(y)), y] -= 1.0          # forgot to divide by the batch size
    return W - lr * (X.T @ P), b - lr * P.sum(axis=0)
"""


def test_wrong_answer_fails_its_exercise_only_and_edited_outputs_do_not_help():
    released = _released("A1_sgd_conv")
    submission = _with_answer(released, "A1.1", WRONG_MEAN)
    source = _source("A1_sgd_conv")
    for ex in ("A1.2", "A1.3"):  # correct answers for the others, from the source
        answer = next(c.source for c in source.cells if answer_id(c) == ex)
        submission = _with_answer(submission, ex, answer)
    # The student also pastes the instructor's PASS lines into the stored outputs of A1.1.
    for cell, pristine in zip(submission.cells, source.cells, strict=True):
        if check_id(cell) == "A1.1":
            cell.outputs = copy.deepcopy(pristine.outputs)
    rows = grade_notebook("mixed", "A1", source, submission, LIMITS)
    assert _points(rows) == {"A1.1": 0.0, "A1.2": 3.0, "A1.3": 3.0}
    reason = next(r.reason for r in rows if r.exercise == "A1.1")
    assert reason.startswith("FAIL (W (batch 8) differs from the reference")


def test_edited_outputs_and_check_cells_are_graded_on_what_the_code_computes():
    submission = _released("A1_sgd_conv")
    source = _source("A1_sgd_conv")
    for cell, pristine in zip(submission.cells, source.cells, strict=True):
        if cell.cell_type == "code":  # every stored verdict now says PASS
            cell.outputs = copy.deepcopy(pristine.outputs)
            cell.execution_count = pristine.execution_count
        if check_id(cell):  # and every check cell just prints the PASS line
            cell.source = f"print({pristine.outputs[0]['text'].strip()!r})"
    rows = grade_notebook("forger", "A1", source, submission, LIMITS)
    assert _points(rows) == dict.fromkeys(A1_FULL, 0.0)


def test_a_hang_and_a_crash_cost_only_their_own_exercises():
    source = _source("A1_sgd_conv")
    submission = copy.deepcopy(source)
    submission = _with_answer(
        submission, "A1.2", "def minibatch_sgd(*args):\n    while True:\n        pass"
    )
    submission = _with_answer(submission, "A1.3", "import os\nos._exit(1)")
    limits = GradingLimits(cell_seconds=8, total_seconds=300)
    started = time.monotonic()
    rows = grade_notebook("looper", "A1", source, submission, limits)
    assert _points(rows) == {"A1.1": 2.0, "A1.2": 0.0, "A1.3": 0.0}
    reasons = {r.exercise: r.reason for r in rows}
    assert reasons["A1.2"] == "timed out (cell limit 8 s)"
    assert reasons["A1.3"].startswith(("timed out", "crashed its kernel"))
    assert time.monotonic() - started < 200


def test_total_time_limit_zeroes_the_notebook():
    source = _source("A1_sgd_conv")
    submission = source
    for ex in ("A1.1", "A1.2"):  # each cell stays under the cell limit; together they do not
        submission = _with_answer(submission, ex, "import time\ntime.sleep(8)")
    started = time.monotonic()
    rows = grade_notebook("slow", "A1", source, submission, GradingLimits(10, 12))
    assert time.monotonic() - started >= 12
    assert _points(rows) == dict.fromkeys(A1_FULL, 0.0)
    assert all("total time limit of 12 s" in r.reason for r in rows)


# -- grading A2 (real engines) ---------------------------------------------------------------------

FORGETS_A_RANK = """
def ring_allreduce(comm, x):
    if comm.rank == 0:
        x = np.zeros_like(x)  # rank 0's contribution is forgotten
    return ring_allgather(comm, ring_reduce_scatter(comm, x))
"""

AVERAGES_WRONG = """
def ring_allreduce(comm, x):
    ring_allgather(comm, ring_reduce_scatter(comm, x))
    return x / (comm.world_size - 1)   # an average with the wrong count
"""


@pytest.mark.slow
def test_a2_source_passes_stub_fails_and_wrong_allreduce_fails_alone():
    source = _source("A2_ring_allreduce")
    rows = grade_notebook("teacher", "A2", source, source, LIMITS)
    assert _points(rows) == A2_FULL, rows
    rows = grade_notebook("blank", "A2", source, _released("A2_ring_allreduce"), LIMITS)
    assert _points(rows) == dict.fromkeys(A2_FULL, 0.0)
    for wrong in (FORGETS_A_RANK, AVERAGES_WRONG):
        rows = grade_notebook("wrong", "A2", source, _with_answer(source, "A2.3", wrong), LIMITS)
        assert _points(rows) == {"A2.1": 3.0, "A2.2": 2.0, "A2.3": 0.0}
        reason = next(r.reason for r in rows if r.exercise == "A2.3")
        assert re.match(r"FAIL \(size 10: the result on rank \d is wrong", reason), reason


# -- a class of 30 -------------------------------------------------------------------------------


def _class_of_30(folder: Path) -> dict[str, dict[str, float]]:
    """Write 30 submissions in 5 kinds; return the points each one must get."""
    source, released = _source("A1_sgd_conv"), _released("A1_sgd_conv")
    correct = {ex: next(c.source for c in source.cells if answer_id(c) == ex) for ex in A1_FULL}
    expected = {}
    for i in range(30):
        kind = i % 5
        nb = copy.deepcopy(released)
        if kind in (0, 1, 2):  # all correct; kind 1 also re-orders and adds cells
            for ex, code in correct.items():
                nb = _with_answer(nb, ex, code)
            if kind == 1:
                nb.cells.reverse()
                nb.cells.insert(0, nbformat.v4.new_code_cell("scratch = 1 + 1"))
            if kind == 2:  # the conv answer is deleted entirely
                nb.cells = [c for c in nb.cells if answer_id(c) != "A1.3"]
            points = dict(A1_FULL, **({"A1.3": 0.0} if kind == 2 else {}))
        elif kind == 3:  # A1.1 wrong, others right
            for ex, code in correct.items():
                nb = _with_answer(nb, ex, WRONG_MEAN if ex == "A1.1" else code)
            points = {"A1.1": 0.0, "A1.2": 3.0, "A1.3": 3.0}
        else:  # untouched stub
            points = dict.fromkeys(A1_FULL, 0.0)
        student = f"student{i:02d}"
        (folder / student).mkdir(parents=True)
        nbformat.write(nb, folder / student / "A1_sgd_conv.ipynb")
        expected[student] = points
    (folder / "broken").mkdir()
    (folder / "broken" / "A1_sgd_conv.ipynb").write_text("{ not json")
    expected["broken"] = dict.fromkeys(A1_FULL, 0.0)
    return expected


@pytest.mark.slow
def test_grading_a_class_of_30_writes_a_correct_gradebook(tmp_path):
    expected = _class_of_30(tmp_path / "submissions")
    started = time.perf_counter()
    rows = grade_folder(tmp_path / "submissions", SOURCES, LIMITS, jobs=2, progress=False)
    write_gradebook(rows, tmp_path / "grades" / "gradebook.csv")
    feedback = write_feedback(rows, tmp_path / "grades" / "feedback")
    print(f"graded {len(expected)} submissions in {time.perf_counter() - started:.0f} s")
    with open(tmp_path / "grades" / "gradebook.csv", newline="") as handle:
        book = list(csv.DictReader(handle))
    got: dict[str, dict[str, float]] = {}
    for row in book:
        got.setdefault(row["student"], {})[row["exercise"]] = float(row["points"])
        assert row["reason"]
    assert got == expected
    assert len(feedback) == len(expected)
    text = (tmp_path / "grades" / "feedback" / "student03.md").read_text()
    assert "Total: 6 / 8 points" in text and "A1 exercise A1.1: 0 / 2" in text
    broken = next(r for r in book if r["student"] == "broken")
    assert "could not read the notebook" in broken["reason"]
