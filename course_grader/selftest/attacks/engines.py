"""In-kernel routes to the verdicts of the engine assignments (A2-A7, A9), one each, for the self-test.

Each is a wrong answer to one exercise plus a way to make a check run in the kernel print PASS:
the verdict class rebound, or the check the next cell imports replaced by a forgery. Every one
won its points while the checks ran in the kernel (``tests/grader/selftest/test_grading_attacks.py`` grades
them both ways). The grader now judges the data that the kernel and its engines return, so
each must get 0 points with the reason that names its mistake; ``./kit grade --self-test``
grades them on this machine and fails loudly if one gets points.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_grader.cells import answer_id, check_id
from course_grader.selftest.attacks.counters import FORGED_COUNTERS, WIRE_REASON
from course_grader.selftest.attacks.submissions import (
    A3_ATTACKS,
    A5_ATTACKS,
    A6_ATTACKS,
    A7_ATTACKS,
    edit_answer,
    write_submission,
)

__all__ = [
    "A2_STEERING",
    "ENGINE_ROUTES",
    "EngineRoute",
    "grade_engine_routes",
    "write_engine_routes",
]

#: Right answers whose probe output is steered through ``cluster.run`` (the kernel is untrusted:
#: only data leaves it), at the grader's decoders (issue 35). The first PIDs line after it is
#: nested 100 000 deep (json.loads recursed: the class stopped); in the folded cases, the engine
#: outside the subgroup reports a world of inf ranks (int(inf) in the claims: the class stopped).
A2_STEERING = """\
_course_run, _pid_calls = cluster.run, []
def _steered(fn, *args, **kwargs):
    if getattr(fn, "__name__", "") == "getpid":
        _pid_calls.append(1)
        if len(_pid_calls) == 1:
            print("COURSE-PIDS:" + "[" * 100000 + "]" * 100000)
            raise RuntimeError("steered")
    got = _course_run(fn, *args, **kwargs)
    if len(args) > 1 and args[1] == "folded" and isinstance(got, list):
        got = [(r[0], float("inf"), *r[2:]) if r[0] == -1 else r for r in got]
    return got
cluster.run = _steered
"""

_REBIND_VERDICT = (
    "import pkgutil\ntry:\n    V = pkgutil.resolve_name('course_lib.checks.verdict:Verdict')\n"
    "    V.__str__ = lambda self: {pass_line!r}\n    V.__bool__ = lambda self: True\n"
    "except Exception:\n    pass\n"
)


@dataclass(frozen=True)
class EngineRoute:
    """One attacker: the exercise, what it tries, its answer and the reason its FAIL must give.

    ``old`` empty: ``new`` is the whole answer; else ``old`` (the solution's text) becomes
    ``new`` in the instructor's answer. ``prefix`` runs first; ``{pass_line}`` in it is the
    exercise's PASS line from the source's stored output.
    """

    assignment: str
    notebook: str
    exercise: str
    what: str
    prefix: str
    old: str
    new: str
    reason: str  # a regex
    student: str = ""  # default: route_<assignment>


def _from(assignment: str, notebook: str, exercise: str, attacks: dict, what: str) -> EngineRoute:
    prefix, old, new, reason = attacks[exercise]
    return EngineRoute(assignment, notebook, exercise, what, prefix, old, new, reason)


ENGINE_ROUTES = [
    EngineRoute("A2", "A2_rabenseifner_allreduce", "A2.1",
                "Verdict rebound; a built-in, the counters rewritten", _REBIND_VERDICT,
                "", FORGED_COUNTERS[("A2", "A2.1")], WIRE_REASON),
    EngineRoute("A2", "A2_rabenseifner_allreduce", "A2.2",
                "a right answer, a PIDs line nested 100 000 deep", A2_STEERING,
                "def allgather_doubling", "def allgather_doubling",
                "process ids never reached the grader", student="route_A2_steered"),
    _from("A3", "A3_data_parallel", "A3.2", A3_ATTACKS,
          "a forged verdict; buckets from the first parameter"),
    EngineRoute("A4", "A4_local_sgd_gossip", "A4.1",
                "Verdict.__str__ rebound by name; the plain mean", _REBIND_VERDICT, "",
                "def weighted_average(comm, w, n):\n"
                "    return comm.allreduce(w) / comm.world_size\n", "that is the plain mean"),
    _from("A5", "A5_compression", "A5.1", A5_ATTACKS, "Verdict rebound by name; int8 rounds"),
    _from("A6", "A6_model_pipeline", "A6.2", A6_ATTACKS,
          "Verdict rebound by name; dL/dX not gathered"),
    _from("A7", "A7_zero_stage2", "A7.1", A7_ATTACKS,
          "Verdict rebound by name; the shard of the sum"),
    EngineRoute("A9", "A9_ring_attention", "A9.2",
                "Verdict rebound by name; an allgather, the counters rewritten", _REBIND_VERDICT,
                "", FORGED_COUNTERS[("A9", "A9.2")], WIRE_REASON),
]  # fmt: skip


def write_engine_routes(folder: Path, source_dir: Path) -> dict[str, EngineRoute]:
    """Write one submission per route (``route_A2`` ...); return {student: route}.

    The answers before the attacked exercise are the instructor's (later exercises may use
    them); the later ones are left out, which keeps the class short.
    """
    written = {}
    for route in ENGINE_ROUTES:
        source = nbformat.read(Path(source_dir) / f"{route.notebook}.ipynb", as_version=4)
        order = [answer_id(c) for c in source.cells if answer_id(c)]
        correct = {answer_id(c): c.source for c in source.cells if answer_id(c)}
        passes = {check_id(c): c.outputs[0]["text"].strip() for c in source.cells if check_id(c)}
        prefix = route.prefix.format(pass_line=passes[route.exercise])
        answers = {ex: correct[ex] for ex in order[: order.index(route.exercise)]}
        answers[route.exercise] = (
            edit_answer(correct[route.exercise], route.old, route.new, prefix)
            if route.old
            else prefix + route.new
        )
        student = route.student or f"route_{route.assignment}"
        write_submission(source, folder, student, answers, name=f"{route.notebook}.ipynb")
        written[student] = route
    return written


def grade_engine_routes(folder: Path, source_dir: Path, jobs: int = 2) -> list[tuple[bool, str]]:
    """Grade the routes in the sandbox; return (held, what) per route: held means 0 points
    with the reason that names the mistake."""
    from course_grader.grade import GradingLimits
    from course_grader.gradebook import grade_folder
    from course_grader.sandbox.config import SandboxLimits

    routes = write_engine_routes(folder / "submissions", source_dir)
    rows = grade_folder(
        folder / "submissions",
        source_dir,
        GradingLimits(120, 600),
        jobs=jobs,
        progress=False,
        sandbox=SandboxLimits(processes=256),
    )
    got = {(r.student, r.exercise): r for r in rows}
    held = []
    for student, route in routes.items():
        row = got[(student, route.exercise)]
        ok = row.points == 0 and re.search(route.reason, row.reason) is not None
        what = f"{route.assignment}: {route.what}"
        held.append((ok, f"{what:62s} {route.exercise} {row.points:g} pts: {row.reason[:60]}"))
    return held
