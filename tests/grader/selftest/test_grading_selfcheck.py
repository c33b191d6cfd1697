"""The grader checks itself before grading: a broken grading machine is blamed in one line.

Also the case that used to give every student 0 with ``ModuleNotFoundError``: a checkout whose
``.venv`` is a link to another checkout's environment, whose editable install of ``course_lib``
points to that other checkout (which the sandbox does not show); a machine broken for one
engine assignment only (A3's engine-side module out of the sandbox's sight), which the import
check cannot see and the known-answer run through the whole path does; and the cache of a
passed self-check, used when nothing changed and not when a source did.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_grader.gradebook import load_sources
from course_grader.sandbox.config import (
    SandboxLimits,
    grader_package,
    kit_package,
    sandbox_problem,
)
from course_grader.selftest.selfcheck import (
    GradingMachineError,
    kit_digest,
    preflight,
    remembered,
    selfcheck_key,
)

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"
RELEASED = ROOT / "notebooks" / "assignments"
_PROBLEM = sandbox_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _PROBLEM is not None and ("unshare" in _PROBLEM or not sys.platform.startswith("linux")),
        reason=str(_PROBLEM),
    ),
]


def test_a_passed_self_check_is_remembered_until_the_source_changes(tmp_path):
    # A1 alone (seconds per run): what the cache does is the same for every assignment.
    (tmp_path / "source").mkdir()
    shutil.copy(SOURCES / "A1_sgd_conv.ipynb", tmp_path / "source")
    cache, limits = tmp_path / "cache", SandboxLimits()
    sources = load_sources(tmp_path / "source")
    key = selfcheck_key(sources["A1"], limits, kit_digest())
    cache.mkdir()
    os.mkfifo(cache / f"{key}.json")  # not a regular file: no cache, and no hang on open()
    first = preflight(sources, limits, ["A1"], cache=cache)
    assert first.cached == () and first.assignments["A1"] > 0, first
    assert remembered(cache, key)  # the FIFO replaced by the entry, atomically
    again = preflight(sources, limits, ["A1"], cache=cache)
    assert again.cached == ("A1",) and "A1 from the cache" in again.summary(), again
    # A changed source is checked again (a markdown cell is enough: the key is its content).
    nb = nbformat.read(tmp_path / "source" / "A1_sgd_conv.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("One more hint."))
    nbformat.write(nb, tmp_path / "source" / "A1_sgd_conv.ipynb")
    changed = preflight(load_sources(tmp_path / "source"), limits, ["A1"], cache=cache)
    assert changed.cached == () and changed.assignments["A1"] > 0, changed


def _checkout(tmp_path: Path) -> Path:
    """A second checkout of the kit and the sources, its .venv a link to this environment."""
    checkout = tmp_path / "checkout"
    for package in (kit_package(), grader_package()):
        shutil.copytree(
            package, checkout / package.name, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copytree(SOURCES, checkout / "assignments" / "source")
    (checkout / ".venv").symlink_to(Path(sys.prefix).resolve())
    return checkout


def _grade(checkout: Path, submissions: Path, *options: str) -> subprocess.CompletedProcess:
    """Run ``./kit grade`` as the checkout runs it: its venv's python, from the checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [
            str(checkout / ".venv" / "bin" / "python"),
            "-m",
            "course_grader",
            "grade",
            str(submissions),
            *options,
        ],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_a_machine_broken_for_an_engine_assignment_grades_nobody(tmp_path):
    # The kit's engine-side module of A3 is a link to a file outside the kit (an install that
    # links files in): the grader, outside, imports it; the sandbox shows the kit, not what the
    # link points to, so A3's kernel and engines cannot. The import check (the set-up cells'
    # imports, the checks' modules left out) passes; only A3 graded end to end shows it.
    checkout = _checkout(tmp_path)
    engine = checkout / "course_grader" / "assignments" / "a3" / "engine.py"
    (tmp_path / "elsewhere").mkdir()
    engine.rename(tmp_path / "elsewhere" / "engine.py")
    engine.symlink_to(tmp_path / "elsewhere" / "engine.py")
    submissions = tmp_path / "submissions"
    for student, name in (("ada", "A1_sgd_conv"), ("bo", "A3_data_parallel")):
        (submissions / student).mkdir(parents=True)
        shutil.copy(RELEASED / f"{name}.ipynb", submissions / student)
    grades = tmp_path / "grades"
    cache = tmp_path / "cache"
    done = _grade(checkout, submissions, "--out", str(grades), "--self-check-cache", str(cache))
    assert done.returncode == 3, (done.stdout[-1000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grade: grading machine: A3 "), lines
    assert "a3.engine" in lines[0] and "no student is graded" in lines[0], lines
    assert not grades.exists() and "graded" not in done.stdout  # nobody, not even ada's A1
    assert len(list(cache.glob("*.json"))) <= 1  # A1's pass at most, never A3's failure


def test_a_kit_the_sandbox_cannot_import_stops_grading_with_one_line():
    hidden = SandboxLimits(hidden=(str(kit_package()),))  # the kernel finds no course_lib
    with pytest.raises(GradingMachineError) as caught:
        preflight(load_sources(SOURCES), hidden)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("grading machine:"), message
    assert "course_lib" in message and "the sandbox shows the kit at" in message, message


def test_a_checkout_whose_venv_links_to_another_checkouts_environment_grades(tmp_path):
    # A second checkout: its own kit and sources, .venv a link to this environment, whose
    # editable install (if any) points elsewhere. `./kit grade` runs `.venv/bin/python -m ...`
    # from the checkout, without PYTHONPATH.
    checkout = _checkout(tmp_path)
    (tmp_path / "submissions").mkdir()
    done = _grade(checkout, tmp_path / "submissions", "--out", str(tmp_path / "grades"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the grading machine checked itself" in done.stdout
