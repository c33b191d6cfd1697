"""One student's data can cost only that student: the guard, the decoders, the claims, the batch.

No kernel: each test feeds the grader's own code what a kernel could print or a submission
could hold (issue 35's routes and variants), and asks for a FAIL or a 0 with a reason, never an
exception; the batch test grades a class in which the grader fails on one notebook.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import nbformat
import numpy as np
import pytest

from course_grader.assignments.a1.probe import a1_spec
from course_grader.assignments.a2.probe import a2_claims
from course_grader.grade import ExerciseResult
from course_grader.verdict.claims import ClaimsBuilder, count
from course_grader.verdict.guard import rejected_answers
from course_grader.verdict.kernel_data import (
    KernelDataError,
    Unsupported,
    decode_value,
    marked_json,
    nesting_depth,
)
from course_grader.verdict.probe import MARK, UNJUDGED, judge
from course_grader.verdict.wire import PIDS_MARK, decode_pids

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"


def _npy(array: np.ndarray) -> dict:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return {"npy": base64.b64encode(buf.getvalue()).decode()}


# -- the guard -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    ["_x = " + "+".join(["1"] * 100_000), "_x = " + "-" * 200_000 + "1"],
    ids=["sum_of_100000_terms", "minus_chain"],
)
def test_an_answer_the_guard_cannot_parse_costs_its_exercise_only(code):
    pristine = nbformat.read(SOURCES / "A1_sgd_conv.ipynb", as_version=4)
    rejected = rejected_answers(pristine, {"A1.1": code, "A1.2": "x = 1\n"})
    assert set(rejected) == {"A1.1"}, rejected
    assert rejected["A1.1"].startswith(f"{UNJUDGED}: its cell could not be read ("), rejected


# -- the decoders ------------------------------------------------------------------------------------


def test_a_line_nested_deep_is_refused_before_it_is_parsed():
    deep = "[" * 1_000_000 + "]" * 1_000_000
    with pytest.raises(KernelDataError, match="nested 1000000 deep"):
        marked_json(MARK + deep, MARK)
    assert nesting_depth('["[[[[", {"a": [1]}]') == 3  # brackets inside strings do not count
    assert decode_pids(PIDS_MARK + deep) is None


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused(number):
    with pytest.raises(KernelDataError, match="not finite"):
        marked_json(f"{MARK}[{number}]", MARK)
    assert decode_pids(f"{PIDS_MARK}[12, {number}]") is None


@pytest.mark.parametrize(
    "line",
    ["[1.0, 2]", "[true, 2]", "[0, 2]", "[-3, 2]", "[2, 2]", "[4194305]", "[[1], 2]",
     json.dumps(list(range(1, 300))), "[]", '{"0": 1}', "1"],
)  # fmt: skip
def test_pids_are_a_short_flat_list_of_distinct_pids(line):
    assert decode_pids(PIDS_MARK + line) is None
    assert decode_pids(f"{PIDS_MARK}[7, 9]\n") == [7, 9]


def test_arrays_are_numbers_finite_and_as_large_as_their_bytes():
    assert (decode_value(_npy(np.arange(4))) == np.arange(4)).all()
    assert isinstance(decode_value(_npy(np.array([1.0, np.nan]))), Unsupported)
    assert isinstance(decode_value(_npy(np.array([np.inf], np.float32))), Unsupported)
    for shape in [(99_999_999_999,), (4,), (2,), (3, 0, 7)]:  # headers that lie about 24 bytes
        buf = io.BytesIO()
        header = {"descr": "<f8", "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(buf, header)
        buf.write(np.zeros(3).tobytes())
        got = decode_value({"npy": base64.b64encode(buf.getvalue()).decode()})
        assert isinstance(got, Unsupported), (shape, got)


# -- the claims ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [float("inf"), float("nan"), 2.5, -1, 2**41, "3", None, np.array([1, 2]), True]
)
def test_a_count_is_a_whole_finite_number_in_range(value):
    with pytest.raises(ValueError):
        count(value)


def test_counts_that_would_overflow_or_loop_are_refused():
    claims = ClaimsBuilder()
    with pytest.raises(ValueError):
        claims.barriers(0, 10**12, 1)  # a world of 10^12 ranks: a loop the grader never ends
    with pytest.raises(ValueError):
        claims.sent(0, 5000, 10, 1)  # a rank out of range
    with pytest.raises(ValueError):
        claims.builtins(0, 4, [("allreduce", float("inf"), 8)])
    inf = np.array(float("inf"))
    for line in [
        (np.array(0), inf, None, [], []),
        (np.array(0), np.array(4), None, [], [[1, inf, 0, 8]]),
    ]:
        with pytest.raises(ValueError):
            a2_claims([[line]])


# -- the judge never raises ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stdout",
    [
        MARK + "[" * 100_000,
        MARK + json.dumps([{"value": {"tuple": [_npy(np.array([np.inf]))] * 3}}] * 5),
        MARK + json.dumps([{"error": "UnicodeDecodeError", "message": "x", "line": 10**9}]),
        MARK + json.dumps([{"error": "KeyboardInterrupt", "line": -5}]),
        MARK + '[{"value": NaN}]',
        MARK + "[" + "1" * 5000 + "]",
    ],
    ids=["nested", "inf_arrays", "odd_exception", "base_exception", "nan", "huge_int"],
)
def test_the_judge_returns_a_fail_whatever_the_line(stdout):
    passed, reason = judge(a1_spec(), "A1.1", 3, stdout)
    assert not passed and reason.startswith("FAIL ("), reason


# -- the batch: one notebook that fails the grader, the class goes on, a stopped run resumes -------


def _class(folder: Path) -> Path:
    source = nbformat.read(SOURCES / "A1_sgd_conv.ipynb", as_version=4)
    for student in ("anna", "bob", "carl"):
        (folder / student).mkdir(parents=True)
        nbformat.write(source, folder / student / "A1_sgd_conv.ipynb")
    return folder


def test_a_notebook_the_grader_fails_on_costs_that_student_and_the_run_resumes(
    tmp_path, monkeypatch
):
    import course_grader.gradebook as gradebook

    graded = []

    def fake_grade(student, assignment, pristine, submission, limits, **_kw):
        # stands in for the kernel run (the real one: tests/grader/selftest); the batch is real
        graded.append(student)
        if student == "bob":
            raise RecursionError("maximum recursion depth exceeded")
        return [
            ExerciseResult(student, assignment, ex, 1.0, 1.0, "PASS") for ex in ("A1.1", "A1.2")
        ]

    monkeypatch.setattr(gradebook, "grade_notebook", fake_grade)
    out = tmp_path / "grades"
    subs = _class(tmp_path / "submissions")
    rows = gradebook.grade_folder(subs, SOURCES, jobs=2, progress=False, sandbox=None, out=out)
    by = {(r.student, r.exercise): r for r in rows}
    assert by[("anna", "A1.1")].points == 1.0 and by[("carl", "A1.2")].points == 1.0
    bob = [r for r in rows if r.student == "bob"]
    assert {r.exercise for r in bob} == {"A1.1", "A1.2", "A1.3"}
    assert all(r.points == 0 and r.reason.startswith(f"{UNJUDGED}: RecursionError") for r in bob)
    text = (out / "gradebook.csv").read_text()
    assert not text.startswith("# UNFINISHED") and "bob" in text
    assert sorted(p.name for p in (out / "feedback").iterdir()) == ["anna.md", "bob.md", "carl.md"]

    # a run stopped after its first batch left an unfinished gradebook: the next one resumes
    first = [r for r in rows if r.student in ("anna", "bob")]
    gradebook.write_gradebook(first, out / "gradebook.csv", f"{gradebook.UNFINISHED} note")
    assert gradebook.read_unfinished(out / "gradebook.csv") == first
    graded.clear()
    again = gradebook.grade_folder(subs, SOURCES, jobs=2, progress=False, sandbox=None, out=out)
    assert graded == ["carl"] and again == rows
    assert gradebook.read_unfinished(out / "gradebook.csv") == []  # finished: not reused
