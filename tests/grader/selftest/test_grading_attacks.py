"""Attacks on the grader, graded end to end by the real grader in the real sandbox: one class, one run.

One class of A1 submissions, graded once for every test of the module (issue 34: one grading run
where three modules graded three classes): two honest students beside

- the attackers on the sandbox (:data:`course_grader.selftest.attacks.sandbox.ATTACKS`): the kit,
  the venv, the sources, other submissions and the gradebook written or read, a fork bomb, the
  disk and the memory filled, the outside network, 200 busy processes, an output flood;
- one attacker per route past the ``ast`` guard
  (:data:`course_grader.selftest.attacks.verdict.ROUTES`): the verdict reached from inside the kernel
  (rebound ``Verdict``/``print``, a pickle calling exec, frame walks, ``object.__subclasses__()``,
  torch or the kit's reference fetched past the guard, results held for the notebook's own inputs,
  forged probe output) and the grading machine reached from inside the sandbox (a forged
  ipyparallel cluster file, a FIFO in its place, ``$IPYTHONDIR`` and the socket folder filled);

and, graded at the same time on one core of its own, a starving answer (200 busy processes, each
in a session of its own, its notebook kept alive just under the cell limit) beside an honest one.
Each attacker must lose what it attacked, nothing may run or change outside, the honest students
must get their grades, and the whole class must finish within its limits.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from course_grader.grade import GradingLimits
from course_grader.gradebook import grade_folder
from course_grader.sandbox.config import SandboxLimits, kit_package, sandbox_problem
from course_grader.sandbox.integrity import fingerprint
from course_grader.selftest.attacks.sandbox import ATTACKS, write_attack_class
from course_grader.selftest.attacks.verdict import ROUTES, write_route_class
from course_grader.verdict.probe import UNJUDGED

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"
SITE = Path(sysconfig.get_paths()["purelib"])
_PROBLEM = sandbox_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _PROBLEM is not None and ("unshare" in _PROBLEM or not sys.platform.startswith("linux")),
        reason=str(_PROBLEM),
    ),
]
CLASS_SECONDS = 1500  # generous: 25 notebooks of a few seconds, 2 at a time (and 2 beside them)
#: An answer that starves its neighbours: 200 busy processes, each in a session of its own, and
#: its notebook kept alive until the grader stops it (issue 35: the honest notebook beside it
#: passed its total time limit, 0 / 8). They are forked first and start together: forked while
#: the others ran, the last ones came so slowly that the honest notebook was done before them,
#: with or without a share of its own.
STARVER = (
    "import os, time\ngo = time.time() + 3\nfor _ in range(200):\n    if os.fork() == 0:\n"
    "        os.setsid()\n        time.sleep(max(0, go - time.time()))\n"
    "        while True:\n            pass\ntime.sleep(600)\n"
)
#: The honest neighbour's first answer waits until the starving has begun, so that its
#: remaining cells run beside it (on a quiet machine it would be done before).
HONEST_WAITS = "import time\ntime.sleep(12)\n"
#: The starving pair's limits: the starver runs to the total limit, with a whole core of busy
#: processes (the pair's CPU is the starver's, a second a second); the honest notebook needs a
#: few seconds of CPU after its wait, under a quarter of its share's (half the core) in this
#: time, and without a share it gets 1/200 of the core, a fraction of a second, and 0 points.
STARVED_LIMITS = GradingLimits(45, 45)


def _grade_in_thread(
    done: dict, key: str, *args, core: int | None = None, **kwargs
) -> threading.Thread:
    """Start ``grade_folder(*args, **kwargs)`` in a thread (on ``core`` alone, and everything it
    starts, if given); its rows, or the error it raised, go to ``done[key]``."""

    def grade() -> None:
        try:
            if core is not None:  # this thread only: the sandboxes it starts inherit it
                os.sched_setaffinity(0, {core})
                done[key + "_cores"] = os.sched_getaffinity(0)
            done[key] = grade_folder(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported by the tests, with its cause
            done[key + "_error"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=grade, daemon=True)
    worker.start()
    return worker


def _starvation_pair(folder: Path) -> Path | None:
    """Write an honest A1 notebook and a starving one; None where no CPU share can be made."""
    import nbformat

    from course_grader.cells import answer_id
    from course_grader.sandbox.cgroup import cgroup_problem
    from course_grader.selftest.attacks.submissions import write_submission

    if cgroup_problem() is not None:
        return None
    source = nbformat.read(SOURCES / "A1_sgd_conv.ipynb", as_version=4)
    correct = {answer_id(c): c.source for c in source.cells if answer_id(c)}
    write_submission(
        source, folder, "honest", dict(correct, **{"A1.1": HONEST_WAITS + correct["A1.1"]})
    )
    write_submission(
        source, folder, "starver", dict(correct, **{"A1.1": STARVER + correct["A1.1"]})
    )
    return folder


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade the class once, and the starvation pair beside it on one core (each in a thread,
    so that a hang fails the tests instead of hanging)."""
    assert _PROBLEM is None, _PROBLEM
    folder = tmp_path_factory.mktemp("class")
    limits = SandboxLimits(processes=256, disk_mb=32)
    venv_before = fingerprint(SITE, hash_all=False)
    attack = write_attack_class(folder, SOURCES, limits.memory_mb)  # writes its gradebook too
    marker = folder / "PWNED"  # any command that runs on the host creates it
    expected = write_route_class(folder / "routes", SOURCES, marker, kit_package())
    for route in ROUTES:  # the routes' attackers join the class (its honest students are one)
        shutil.move(folder / "routes" / route.student, attack.submissions / route.student)
    pair = _starvation_pair(folder / "starvation")
    done: dict = {}
    started = time.monotonic()
    try:
        workers = [
            _grade_in_thread(done, "rows", attack.submissions, SOURCES, GradingLimits(60, 400),
                             jobs=2, progress=False, sandbox=limits,
                             hidden=(str(attack.grades), str(folder / "starvation"))),
        ]  # fmt: skip
        if pair is not None:  # both notebooks, and all they start, on one core
            core = min(os.sched_getaffinity(0))
            workers.append(_grade_in_thread(done, "starved", pair, SOURCES, STARVED_LIMITS,
                                            jobs=2, progress=False, sandbox=limits, core=core,
                                            hidden=(str(attack.submissions),)))  # fmt: skip
        for worker in workers:
            worker.join(max(1.0, CLASS_SECONDS - (time.monotonic() - started)))
            assert not worker.is_alive(), f"grading the class did not finish in {CLASS_SECONDS} s"
    finally:
        if attack.listener is not None:
            attack.listener.close()
    print(f"class and starvation pair graded in {time.monotonic() - started:.0f} s")
    for key in ("rows", "starved"):
        assert key + "_error" not in done, f"grading raised {done[key + '_error']}"
    return {
        "rows": {(r.student, r.exercise): r for r in done["rows"]},
        "expected": expected,
        "attack": attack,
        "marker": marker,
        "venv_same": fingerprint(SITE, False, venv_before) == venv_before,
        "starved": done.get("starved"),
        "starved_cores": done.get("starved_cores"),
    }


def test_attacks_on_the_sandbox_cost_the_attacker_and_nothing_else(graded):
    got, attack = graded["rows"], graded["attack"]
    # Each attack was tried, and stopped by the sandbox with the error it names.
    missed = [
        (what, row.points, row.reason)
        for student, exercise, what, _code, why in ATTACKS
        if (row := got[(student, exercise)]).points != 0 or not re.search(why, row.reason)
    ]
    assert not missed
    honest = {
        s: {ex: got[(s, ex)].points for ex in ("A1.1", "A1.2", "A1.3")}
        for s in attack.expected_honest
    }
    assert honest == attack.expected_honest
    assert not attack.unchanged()
    assert graded["venv_same"]
    assert not attack.connections


def test_a_notebook_of_busy_processes_cannot_starve_the_honest_one_on_one_core(graded):
    if graded["starved"] is None:
        from course_grader.sandbox.cgroup import cgroup_problem

        pytest.skip(f"no CPU share per sandbox here: {cgroup_problem()}")
    assert len(graded["starved_cores"]) == 1, graded["starved_cores"]
    got = {(r.student, r.exercise): r.points for r in graded["starved"]}
    assert {ex: got[("honest", ex)] for ex in ("A1.1", "A1.2", "A1.3")} == {
        "A1.1": 2.0, "A1.2": 3.0, "A1.3": 3.0
    }, graded["starved"]  # fmt: skip


def test_honest_students_get_their_grades_beside_the_attackers(graded):
    for student in ("honest_1", "honest_2"):
        got = {ex: graded["rows"][(student, ex)].points for ex in ("A1.1", "A1.2", "A1.3")}
        assert got == graded["expected"][student], (student, got)
    assert graded["rows"][("honest_2", "A1.1")].reason.startswith("FAIL (dW (batch 8, 4 classes")


def test_nothing_ran_or_changed_on_the_grading_machine(graded):
    assert not graded["marker"].exists(), "a command from inside the sandbox ran on the host"
    assert not graded["attack"].unchanged()  # the gradebook and feedback among the watched


@pytest.mark.parametrize("route", ROUTES, ids=[r.student for r in ROUTES])
def test_each_route_costs_its_exercise_and_nothing_else(graded, route):
    rows, expected = graded["rows"], graded["expected"][route.student]
    a11 = rows[(route.student, "A1.1")]
    assert a11.points == 0.0, f"{route.what}: {a11.reason}"
    assert a11.reason.startswith(("FAIL", "the answer cell raised", UNJUDGED)), a11.reason
    if route.reason:
        assert re.search(route.reason, a11.reason), a11.reason
    for exercise in ("A1.2", "A1.3"):
        if expected[exercise] is not None:
            assert rows[(route.student, exercise)].points == expected[exercise], rows[
                (route.student, exercise)
            ]


# -- A2: the engines return data; the grader judges every rank ------------------------------------

A2_ATTACKS = {
    # The built-in reduce-scatter (right sums, wrong algorithm), and the verdict rebound.
    # (The verdict's module sits in course_lib/checks, which A2's kernel does not even see.)
    "A2.1": "import pkgutil, sys\ntry:\n    pkgutil.resolve_name('course_lib.checks.verdict')\n"
    "    V = getattr(sys, 'modules')['course_lib.checks.verdict'].Verdict\n"
    "    V.__bool__ = lambda self: True\n    V.__str__ = lambda self: {pass_line!r}\n"
    "except Exception:\n    pass\n"
    "def reduce_scatter_halving(comm, x):\n"
    "    return comm.reduce_scatter(x)\n",
    # The kit's checks fetched by name, to read the byte counts the algorithm must send.
    "A2.2": "import pkgutil\ntry:\n    judge = pkgutil.resolve_name('course_grader.assignments.a2.judge:judge_rank')\n"
    "except Exception:\n    judge = None\n"
    "def allgather_doubling(comm, x):\n    return comm.allreduce(x)\n",
    # A frame walk from inside the engines' call to whatever checks the result.
    "A2.3": "def rabenseifner_allreduce(comm, x):\n"
    "    import inspect\n    frame = inspect.currentframe()\n    while frame is not None:\n"
    "        getattr(frame, 'f_glo' + 'bals').pop('judge_rank', None)\n"
    "        frame = getattr(frame, 'f_ba' + 'ck')\n    return comm.allreduce(x)\n",
}


def test_a2_class_routes_to_the_verdict_and_to_the_grader_cost_only_their_exercises(tmp_path):
    """One A2 class: an honest student, the routes to the verdict (a built-in behind a rebound
    Verdict, the checks fetched by name, a frame walk), and right answers steered at the grader's
    decoders through ``cluster.run`` (a PIDs line nested 100 000 deep, a world of inf ranks:
    either stopped the whole class before issue 35). The gradebook is written, marked finished."""
    import copy

    import nbformat

    from course_grader.cells import answer_id, check_id, check_points
    from course_grader.selftest.attacks.engines import A2_STEERING
    from course_grader.selftest.attacks.submissions import write_submission
    from course_grader.verdict.guard import rejected_answers

    name = "A2_rabenseifner_allreduce.ipynb"
    source = nbformat.read(SOURCES / name, as_version=4)
    passes = {check_id(c): c.outputs[0]["text"].strip() for c in source.cells if check_id(c)}
    points = {check_id(c): check_points(c) for c in source.cells if check_id(c)}
    correct = {answer_id(c): c.source for c in source.cells if answer_id(c)}
    attacks = {ex: code.format(pass_line=passes[ex]) for ex, code in A2_ATTACKS.items()}
    steered = dict(correct, **{"A2.2": A2_STEERING + correct["A2.2"]})
    assert not rejected_answers(source, attacks) and not rejected_answers(source, steered)
    subs, out = tmp_path / "submissions", tmp_path / "grades"
    for student, answers in (
        ("a2_honest", correct),
        ("a2_attacker", attacks),
        ("a2_steered", steered),
    ):
        write_submission(copy.deepcopy(source), subs, student, answers, name=name)
    rows = grade_folder(subs, SOURCES, GradingLimits(90, 600), jobs=2, progress=False,
                        sandbox=SandboxLimits(processes=256), out=out)  # fmt: skip
    got = {(r.student, r.exercise): r for r in rows}
    # The honest student's answers are the source's: its full marks are the source's (the only
    # grading of A2's source; test_grading_a2.py grades the stub and the mistakes).
    assert {ex: got[("a2_honest", ex)].points for ex in points} == points, rows
    assert all(got[("a2_honest", ex)].reason == "PASS" for ex in points), rows
    reasons = {ex: got[("a2_attacker", ex)].reason for ex in points}
    assert {ex: got[("a2_attacker", ex)].points for ex in points} == dict.fromkeys(points, 0.0)
    assert "uses the built-in comm.reduce_scatter" in reasons["A2.1"], reasons
    assert "uses the built-in comm.allreduce" in reasons["A2.2"], reasons
    assert "uses the built-in comm.allreduce" in reasons["A2.3"], reasons
    steered_rows = {ex: got[("a2_steered", ex)] for ex in points}
    assert steered_rows["A2.2"].points == 0.0, steered_rows
    assert "process ids never reached the grader" in steered_rows["A2.2"].reason, steered_rows
    assert steered_rows["A2.1"].points == points["A2.1"], steered_rows  # earned before it
    assert steered_rows["A2.3"].points == points["A2.3"], steered_rows  # the inf world: ignored
    text = (out / "gradebook.csv").read_text()
    assert not text.startswith("# UNFINISHED") and text.count("a2_steered") == 3, text
    assert sorted(p.name for p in (out / "feedback").iterdir()) == [
        "a2_attacker.md", "a2_honest.md", "a2_steered.md"
    ]  # fmt: skip


def test_the_grader_never_unpickles_what_a_probe_printed(tmp_path):
    # Fast, no kernel: the line a kernel could print, holding a pickled object array whose
    # loading would run a command. The grader must refuse it as data, and run nothing.
    import base64
    import io
    import json
    import os

    import numpy as np

    from course_grader.assignments.a1.probe import a1_spec
    from course_grader.verdict.probe import MARK, judge

    marker = tmp_path / "PWNED"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    buf = io.BytesIO()
    np.save(buf, np.array([Boom()], dtype=object), allow_pickle=True)
    blob = {"npy": base64.b64encode(buf.getvalue()).decode()}
    line = MARK + json.dumps([{"value": {"tuple": [blob, blob, blob]}}] * 5)
    passed, reason = judge(a1_spec(), "A1.1", 3, line)
    assert not passed and reason.startswith("FAIL"), reason
    assert not marker.exists()


# -- A4: a route that used to work in the kernel, and now gets nothing ----------------------------

# Graded beside the library's gossip transcribed as A4.3 (test_checks_a4.py's grading test):
# A4.1's plain mean behind Verdict.__str__ rebound to print A4.1's PASS line gets nothing, and
# A4.2's own Local-SGD its points (that route won A4.1's 3 points when the kernel decided).

# What these routes won when the kernel decided the verdict (the path retired at the package split;
# recorded from the last grader that had it, 241c8fb): the wrong answers got full marks there.
WON_IN_THE_KERNEL = {"A4.1": 3.0, "A3.2": 2.0, "A5": "full", "A6": "full", "A7": "full"}


# -- A3: a forged verdict object that passed in the kernel ---------------------------------------

# Graded with A3's typical mistakes (tests/grader/assignments/test_grading_a3.py): A3.2's buckets
# from the first parameter, its check replaced by one returning a forged verdict
# (submissions.A3_ATTACKS, shared with the self-test's engine route), gets nothing; that route
# won A3.2's 2 points when the kernel decided the verdict (WON_IN_THE_KERNEL["A3.2"]).


# -- A5, A6 and A7: the kernel returns arrays and counts; the grader judges ---------------------------

# (assignment, notebook, exercises answered honestly: points, answers replaced to keep it short)
ROUTED = [
    ("A5", "A5_compression", {"A5.2": 1.0, "A5.3": 2.0},
     {"A5.6": "def a5_compressor():\n    raise NotImplementedError('Exercise A5.6')\n"}),
    ("A6", "A6_model_pipeline", {"A6.1": 2.0, "A6.3": 3.0}, {}),
    ("A7", "A7_zero_stage2", {}, {}),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("assignment", "name", "honest", "replaced"), ROUTED, ids=["A5", "A6", "A7"]
)
def test_routes_that_won_in_the_kernel_get_nothing_from_the_grader(
    tmp_path, assignment, name, honest, replaced
):
    import copy

    import nbformat

    from course_grader.cells import answer_id, check_id
    from course_grader.grade import grade_notebook
    from course_grader.selftest.attacks import submissions
    from course_grader.verdict.guard import rejected_answers

    attacks = getattr(submissions, f"{assignment}_ATTACKS")
    source = nbformat.read(SOURCES / f"{name}.ipynb", as_version=4)
    passes = {check_id(c): c.outputs[0]["text"].strip() for c in source.cells if check_id(c)}
    submission = copy.deepcopy(source)
    for cell in submission.cells:
        exercise = answer_id(cell)
        if exercise in attacks:
            prefix, old, new, _ = attacks[exercise]
            prefix = prefix.format(pass_line=passes[exercise])
            cell.source = submissions.edit_answer(cell.source, old, new, prefix)
        elif exercise in replaced:  # (A5.6 would train: this test is about the verdicts)
            cell.source = replaced[exercise]
    answers = {answer_id(c): c.source for c in submission.cells if answer_id(c)}
    assert not rejected_answers(source, answers)  # past the guard
    limits, sandbox = GradingLimits(90, 600), SandboxLimits(processes=256)

    def grade() -> dict:
        rows = grade_notebook("attacker", assignment, source, submission, limits,
                              workdir=tmp_path, sandbox=sandbox)  # fmt: skip
        return {r.exercise: r for r in rows}

    assert WON_IN_THE_KERNEL[assignment] == "full"  # the routes were real there
    rows = grade()
    assert {ex: rows[ex].points for ex in attacks} == dict.fromkeys(attacks, 0.0), rows
    for exercise, (*_, reason) in attacks.items():
        assert re.search(reason, rows[exercise].reason), rows[exercise].reason
    assert {ex: rows[ex].points for ex in honest} == honest, rows
    if submissions.typical_mistakes_are_the_routes(assignment):  # the typical student's run too
        assert set(rows) == {*attacks, *honest}, rows  # (test_grading_a5_to_a8.py's third run)
        for exercise, _, _, reason in getattr(submissions, f"{assignment}_MISTAKES"):
            got = rows[exercise].reason
            assert got.startswith("FAIL (") and reason in got, (exercise, got)
