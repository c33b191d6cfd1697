"""Adding an assignment is one folder: a made-up A99 is found, released, self-checked and graded.

A second checkout of the kit gets ``course_grader/assignments/a99/`` (its checks and its probe)
and its source notebook, and nothing else changes: the grader's command line, run from that
checkout as ``./kit release`` and ``./kit grade`` run it, releases the student's copy with a stub,
self-checks A99 through the whole path (the instructor's answer must get full marks) and grades a
right answer and the stub, in the sandbox where the machine has one.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_grader.registry import assignments
from course_grader.sandbox.config import grader_package, kit_package

CHECKS = '''"""A99 (a made-up assignment of the tests): double a vector."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from course_lib.checks.verdict import Verdict, assert_close, run_check

__all__ = ["check_double", "double_inputs"]


def double_inputs(seed: int = 0) -> list[dict]:
    """Three vectors drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=n)} for n in (1, 5, 17)]


def check_double(double: Callable, *, verbose: bool = True, seed: int = 0) -> Verdict:
    """A99.1: ``double(x) -> 2 x``."""

    def body() -> str:
        cases = double_inputs(seed)
        for case in cases:
            assert_close("double(x)", np.asarray(double(case["x"].copy())), 2 * case["x"])
        return f"twice each of {len(cases)} vectors"

    return run_check("A99.1", "double", body, max_points=2.0, verbose=verbose)
'''

PROBE = '''"""A99 (a made-up assignment of the tests): the kernel calls the answer, the grader checks."""

from __future__ import annotations

from course_grader.verdict.probe import ExerciseProbe, ProbeSpec

__all__ = ["a99_spec"]


def a99_spec() -> ProbeSpec:
    """A99's probe: one exercise, no engines."""
    from course_grader.assignments.a99 import checks

    return ProbeSpec(
        kernel_setup="import numpy as np\\n",
        exercises={
            "A99.1": ExerciseProbe(checks.double_inputs, 'double(case["x"].copy())', checks.check_double)
        },
    )
'''


def _source_notebook() -> nbformat.NotebookNode:
    """A99's source: a set-up cell, one answer with its solution, one check cell."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["course"] = {"assignment": "A99", "forbidden_imports": ["torch"]}
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    answer = nbformat.v4.new_code_cell(
        "# Your answer\ndef double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
        "    ### END SOLUTION\n"
    )
    answer.metadata["course"] = {"answer": "A99.1", "hint": "twice x"}
    check = nbformat.v4.new_code_cell(
        "# NBVAL_CHECK_OUTPUT\nfrom course_grader.assignments.a99.checks import check_double\n\n"
        "verdict = check_double(double)"
    )
    check.metadata["course"] = {"check": "A99.1", "points": 2}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Assignment A99: double a vector"),
        nbformat.v4.new_code_cell("import numpy as np"),
        answer,
        check,
    ]
    return nb


def _checkout(tmp_path: Path) -> Path:
    """A second checkout: the kit, the grader with A99's folder, A99's source; .venv linked."""
    checkout = tmp_path / "checkout"
    for package in (kit_package(), grader_package()):
        shutil.copytree(
            package, checkout / package.name, ignore=shutil.ignore_patterns("__pycache__")
        )
    folder = checkout / "course_grader" / "assignments" / "a99"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""A99 (tests): double a vector."""\n')
    (folder / "checks.py").write_text(CHECKS)
    (folder / "probe.py").write_text(PROBE)
    (checkout / "assignments" / "source").mkdir(parents=True)
    (checkout / ".venv").symlink_to(Path(sys.prefix).resolve())
    return checkout


def _grader(checkout: Path, *argv: str) -> subprocess.CompletedProcess:
    """Run ``python -m course_grader ARGV`` from the checkout, as ``./kit`` runs it there."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(checkout / ".venv" / "bin" / "python"), "-m", "course_grader", *argv],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_an_assignment_added_as_one_folder_is_released_self_checked_and_graded(tmp_path):
    checkout = _checkout(tmp_path)
    source = _source_notebook()  # the instructor runs the source once: its outputs are stored
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    NotebookClient(source, timeout=120, resources={"metadata": {"path": str(checkout)}}).execute(
        env=env
    )
    assert "double: PASS" in source.cells[3].outputs[0]["text"], source.cells[3].outputs
    nbformat.write(source, checkout / "assignments" / "source" / "A99_double.ipynb")

    released = _grader(checkout, "release")
    assert released.returncode == 0, released.stderr
    student = nbformat.read(checkout / "notebooks" / "assignments" / "A99_double.ipynb", 4)
    assert "raise NotImplementedError" in student.cells[2].source
    assert "return 2 * x" not in student.cells[2].source  # the solution never reaches students

    submissions = tmp_path / "submissions"
    for name, nb in (("ada", source), ("bo", student)):
        (submissions / name).mkdir(parents=True)
        nbformat.write(nb, submissions / name / "A99_double.ipynb")
    grades, cache = tmp_path / "grades", tmp_path / "cache"
    done = _grader(
        checkout, "grade", str(submissions), "--out", str(grades),
        "--self-check-cache", str(cache),
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "A99" in done.stdout  # the self-check names the assignment it ran
    with open(grades / "gradebook.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(line for line in f if line[0] != "#")}
    assert (rows["ada"]["points"], rows["ada"]["reason"]) == ("2.0", "PASS"), rows
    assert rows["bo"]["points"] == "0.0", rows
    assert rows["bo"]["reason"].startswith("FAIL (not implemented yet: Exercise A99.1"), rows


def test_the_registry_finds_every_assignment_folder_and_names_a_missing_spec(tmp_path, monkeypatch):
    found = assignments()
    assert sorted(found) == [f"A{n}" for n in range(1, 10)], sorted(found)
    assert all(callable(factory) for factory in found.values())
    folder = tmp_path / "made_up_assignments"  # a folder whose probe forgot its spec
    (folder / "a12").mkdir(parents=True)
    (folder / "notes").mkdir()  # not an assignment: skipped
    for init in (folder / "__init__.py", folder / "a12" / "__init__.py"):
        init.write_text("")
    (folder / "a12" / "probe.py").write_text("def spec():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match=r"made_up_assignments\.a12\.probe defines no a12_spec"):
        assignments(folder)
