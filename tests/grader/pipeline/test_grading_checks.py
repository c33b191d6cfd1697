"""Students check their work without the solutions: the checking copies and ``./kit check``.

A course that keeps ``assignments/source`` private ships ``assignments/checks`` instead: the
sources with every answer stubbed and only the compared outputs (the PASS lines) kept. A check
against that copy must give the grader's verdicts, and hold no solution text.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_grader import __main__ as cli
from course_grader.cells import BEGIN, END, answer_id, check_id, output_is_compared
from course_grader.grade import build_graded_notebook
from course_grader.release import checking_copy

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"
CHECKS = ROOT / "assignments" / "checks"
RELEASED = ROOT / "notebooks" / "assignments"
NAMES = [
    "A1_sgd_conv",
    "A2_rabenseifner_allreduce",
    "A3_data_parallel",
    "A4_local_sgd_gossip",
    "A5_compression",
    "A6_model_pipeline",
    "A7_zero_stage2",
    "A8_choosing_a_strategy",
    "A9_ring_attention",
]

WRONG_LOSS = """
def smoothed_cross_entropy(W, b, X, y, eps):
    return 0.0, np.zeros_like(W), np.zeros_like(b)  # forgot everything
"""


def _read(folder: Path, name: str) -> nbformat.NotebookNode:
    return nbformat.read(folder / f"{name}.ipynb", as_version=4)


def _solution_lines(source: nbformat.NotebookNode) -> list[str]:
    """Return the non-trivial code lines inside the source's solution regions."""
    lines, inside = [], False
    for cell in source.cells:
        for line in cell.source.splitlines():
            if BEGIN in line or END in line:
                inside = BEGIN in line
            elif inside and len(line.strip()) > 12:
                lines.append(line.strip())
    return lines


def _answer(nb: nbformat.NotebookNode, exercise: str) -> str:
    return next(cell.source for cell in nb.cells if answer_id(cell) == exercise)


def _with(nb: nbformat.NotebookNode, answers: dict[str, str | None]) -> nbformat.NotebookNode:
    """Return ``nb`` with these answers put in (None: the answer cell deleted)."""
    nb = copy.deepcopy(nb)
    for exercise, code in answers.items():
        cell = next(c for c in nb.cells if answer_id(c) == exercise)
        if code is None:
            nb.cells.remove(cell)
        else:
            cell.source = code
    return nb


def _what_nbval_runs(nb: nbformat.NotebookNode) -> list[tuple[str, list | None]]:
    """Return each code cell's source and, where nbval compares it, its stored output."""
    return [
        (cell.source, cell.outputs if output_is_compared(cell) else None)
        for cell in nb.cells
        if cell.cell_type == "code"
    ]


@pytest.mark.parametrize("name", NAMES)
def test_checking_copies_are_up_to_date_and_hold_no_solution(name: str) -> None:
    source = _read(SOURCES, name)
    committed = _read(CHECKS, name)
    fresh = checking_copy(source, source.metadata["course"]["assignment"])
    assert nbformat.writes(committed) == nbformat.writes(fresh), "stale: run ./kit release"
    # The task text is the student notebook's (it quotes some code); all else is searched:
    # code, outputs, metadata.
    markdown = [c.source for c in committed.cells if c.cell_type == "markdown"]
    assert markdown[1:] == [
        c.source for c in _read(RELEASED, name).cells if c.cell_type == "markdown"
    ]
    rest = copy.deepcopy(committed)
    rest.cells = [c for c in rest.cells if c.cell_type != "markdown"]
    text = nbformat.writes(rest)
    solution = _solution_lines(source)
    assert len(solution) >= 3
    assert BEGIN not in text and END not in text
    leaked = [line for line in solution if line in text or json.dumps(line)[1:-1] in text]
    assert not leaked, f"solution code in the checking copy: {leaked}"
    checks = [c for c in committed.cells if check_id(c)]
    pristine = [c for c in source.cells if check_id(c)]
    assert checks and [c.outputs for c in checks] == [c.outputs for c in pristine]
    assert all("PASS" in c.outputs[0]["text"] for c in checks)  # the grader's verdicts
    for cell in committed.cells:
        if cell.cell_type == "code" and not output_is_compared(cell):
            assert cell.outputs == [], cell.source[:80]  # only compared outputs stay


@pytest.mark.parametrize("name", NAMES)
def test_a_submission_makes_the_same_graded_notebook_in_either_copy(name: str) -> None:
    # nbval sees the same code and the same stored verdicts, so it must give the same verdicts.
    source, checks = _read(SOURCES, name), _read(CHECKS, name)
    released = _read(RELEASED, name)
    exercises = [answer_id(c) for c in source.cells if answer_id(c)]
    first, *rest = exercises
    submissions = {
        "correct": _with(released, {ex: _answer(source, ex) for ex in exercises}),
        "stub": released,
        "wrong and missing": _with(released, {first: "raise ValueError('wrong')", rest[0]: None}),
    }
    for label, submission in submissions.items():
        assert _what_nbval_runs(build_graded_notebook(checks, submission)) == _what_nbval_runs(
            build_graded_notebook(source, submission)
        ), label


def _check_alone(notebook: Path, checks: Path, monkeypatch, capsys) -> tuple[int, list[str]]:
    """Run ``./kit check NOTEBOOK`` where only the checking copies exist; return its lines."""
    monkeypatch.setattr(cli, "SOURCES", checks.parent / "no-such-source")
    monkeypatch.setattr(cli, "CHECKS", checks)
    status = cli.main(["check", str(notebook), "--cell-timeout", "45"])
    return status, capsys.readouterr().out.splitlines()


def _verdicts_in_process(submission: nbformat.NotebookNode) -> list[str]:
    """Return the verdict of each A1 check on the submission's answers, run in this process."""
    import numpy as np

    from course_grader.assignments.a1 import checks as a1

    checks = [
        ("A1.1", a1.check_smoothed_cross_entropy, "smoothed_cross_entropy"),
        ("A1.2", a1.check_sgd_momentum, "sgd_momentum"),
        ("A1.3", a1.check_conv2d_backward, "conv2d_backward"),
    ]
    lines = []
    for exercise, check, name in checks:
        namespace = {"np": np}
        exec(_answer(submission, exercise), namespace)
        verdict = check(namespace[name], verbose=False)
        reason = "PASS" if verdict.passed else f"FAIL ({verdict.detail})"
        lines.append(
            f"A1 exercise {exercise}: {verdict.points:g}/{verdict.max_points:g} — {reason}"
        )
    return lines


@pytest.mark.slow
def test_check_from_the_checking_copy_alone_gives_the_graders_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # The graded notebook is the grader's (test above), so nbval must reach the grader's
    # verdicts: those the checks give on the same code. One real run shows the path works
    # with nothing but the checking copy (the grader's own run is test_grading.py's business).
    name = "A1_sgd_conv"
    source, released = _read(SOURCES, name), _read(RELEASED, name)
    # A1.1 wrong, A1.2 correct, A1.3 the released stub: the three verdicts in one notebook.
    submission = _with(released, {"A1.1": WRONG_LOSS, "A1.2": _answer(source, "A1.2")})
    path = tmp_path / "student" / f"{name}.ipynb"
    path.parent.mkdir()
    nbformat.write(submission, path)
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / f"{name}.ipynb").write_bytes((CHECKS / f"{name}.ipynb").read_bytes())

    status, lines = _check_alone(path, checks, monkeypatch, capsys)
    print("\n".join(lines))
    assert status == 0
    assert lines[0].endswith("against the checking copies")
    expected = _verdicts_in_process(submission)
    assert lines[1:-1] == expected
    assert [line.split(": ")[1].split(" ")[0] for line in expected] == ["0/2", "3/3", "0/3"]
    assert "FAIL (not implemented yet: Exercise A1.3" in expected[2]  # the stub's own verdict
    assert lines[-1] == "total 3/8"


BAD_INPUT = [
    (["check", "{tmp}/missing.ipynb"], "does not exist: give the path"),
    (["check", "{tmp}/notes.ipynb"], "is not a readable notebook"),
    (["check", "{tmp}/homework.ipynb"], "keep the file name it was released with"),
    (["check", "{tmp}/A1_x.ipynb", "--cell-timeout", "-1"], "use a positive cell limit"),
    (["check", "{tmp}/A1_x.ipynb", "--source", "{tmp}/empty"], "pass --source FOLDER"),
    (["grade", "{tmp}/no-class"], "is not a folder of submitted notebooks"),
    (["release", "--source", "{tmp}/empty", "--dest", "{tmp}/out"], "pass --source FOLDER"),
]


@pytest.mark.parametrize("argv, fix", BAD_INPUT, ids=[" ".join(a[:2]) for a, _ in BAD_INPUT])
def test_bad_input_prints_one_line_that_names_the_fix(
    argv: list[str], fix: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "notes.ipynb").write_text("my notes, not JSON")
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "homework.ipynb")
    nbformat.write(_read(RELEASED, "A1_sgd_conv"), tmp_path / "A1_x.ipynb")
    (tmp_path / "empty").mkdir()
    status = cli.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and fix in err[0], err
    assert err[0].startswith("kit: ")


def test_a_bad_job_exits_non_zero_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "course_grader", "check", str(tmp_path / "missing.ipynb")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
