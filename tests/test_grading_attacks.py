"""Attacks past the ``ast`` guard, graded end to end by the real grader in the real sandbox.

One class of A1 submissions: two honest students and one attacker per route
(:data:`course_lib.grading.attacks_verdict.ROUTES`): the verdict reached from inside the kernel
(rebound ``Verdict``/``print``, a pickle calling exec, frame walks, ``object.__subclasses__()``,
torch or the kit's reference fetched past the guard, results held for the notebook's own inputs,
forged probe output) and the grading machine reached from inside the sandbox (a forged
ipyparallel cluster file, a FIFO in its place, ``$IPYTHONDIR`` and the socket folder filled).
Each attacker must lose A1.1, nothing may run or change outside, the honest students must get
their grades, and the whole class must finish within its limits.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest

from course_lib.grading.attacks_verdict import ROUTES, write_route_class
from course_lib.grading.grade import GradingLimits
from course_lib.grading.gradebook import grade_folder
from course_lib.grading.sandbox import SandboxLimits, kit_package, sandbox_problem

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "assignments" / "source"
_PROBLEM = sandbox_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _PROBLEM is not None and ("unshare" in _PROBLEM or not sys.platform.startswith("linux")),
        reason=str(_PROBLEM),
    ),
]
CLASS_SECONDS = 1500  # a generous bound: 18 notebooks of a few seconds each, 2 at a time


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade the class once (in a thread, so that a hang fails the tests instead of hanging)."""
    assert _PROBLEM is None, _PROBLEM
    folder = tmp_path_factory.mktemp("routes")
    marker = folder / "PWNED"  # any command that runs on the host creates it
    grades = folder / "grades"
    grades.mkdir()
    (grades / "gradebook.csv").write_text("student,assignment,exercise,points\n")
    before = (grades / "gradebook.csv").read_bytes()
    expected = write_route_class(folder / "submissions", SOURCES, marker, kit_package())
    done: dict = {}

    def grade() -> None:
        done["rows"] = grade_folder(
            folder / "submissions", SOURCES, GradingLimits(cell_seconds=60, total_seconds=400),
            jobs=2, progress=False, sandbox=SandboxLimits(processes=256, disk_mb=32),
            hidden=(str(grades),),
        )  # fmt: skip

    worker = threading.Thread(target=grade, daemon=True)
    worker.start()
    worker.join(CLASS_SECONDS)
    assert not worker.is_alive(), f"grading the class did not finish in {CLASS_SECONDS} s"
    rows = {(r.student, r.exercise): r for r in done["rows"]}
    return {"rows": rows, "expected": expected, "marker": marker,
            "gradebook_same": (grades / "gradebook.csv").read_bytes() == before}  # fmt: skip


def test_honest_students_get_their_grades_beside_the_attackers(graded):
    for student in ("honest_1", "honest_2"):
        got = {ex: graded["rows"][(student, ex)].points for ex in ("A1.1", "A1.2", "A1.3")}
        assert got == graded["expected"][student], (student, got)
    assert graded["rows"][("honest_2", "A1.1")].reason.startswith("FAIL (dW (batch 8, 4 classes")


def test_nothing_ran_or_changed_on_the_grading_machine(graded):
    assert not graded["marker"].exists(), "a command from inside the sandbox ran on the host"
    assert graded["gradebook_same"]


@pytest.mark.parametrize("route", ROUTES, ids=[r.student for r in ROUTES])
def test_each_route_costs_its_exercise_and_nothing_else(graded, route):
    rows, expected = graded["rows"], graded["expected"][route.student]
    a11 = rows[(route.student, "A1.1")]
    assert a11.points == 0.0, f"{route.what}: {a11.reason}"
    assert a11.reason.startswith(("FAIL", "the answer cell raised")), a11.reason
    if route.reason:
        assert re.search(route.reason, a11.reason), a11.reason
    for exercise in ("A1.2", "A1.3"):
        if expected[exercise] is not None:
            assert rows[(route.student, exercise)].points == expected[exercise], rows[
                (route.student, exercise)
            ]
