"""Benchmark grading with and without the sandbox: the same class of submissions, side by side.

Writes N correct submissions of one assignment (A1 by default; ``--assignment A4`` for one
whose engines talk, and whose bytes on the wire the sandboxed grading also counts), grades
them unisolated and sandboxed (alternating, ``--rounds`` times each, 2 notebooks at once as
``./kit grade`` does), and prints the seconds per class, per notebook, and the sandboxed /
unisolated ratio of the medians (target: at most 1.3), and what the sandboxes' control groups
(their CPU share and memory limit, :mod:`course_grader.sandbox.cgroup`) cost. Both runs include the integrity checks
after each pair of notebooks, and both decide the verdicts in the grader (probes); sandboxed,
A1's kernel has no torch and no kit. Then it times
the grader's self-check (``course_grader.selftest.selfcheck.preflight``), which ``./kit grade``
runs once before the first student, and the reading of a sandbox's socket table that the bytes
on the wire rest on (:mod:`course_grader.sandbox.wire_audit`: twice per probe cell of A2-A7's
exercises whose engines talk).

    .venv/bin/python bench/bench_grading_sandbox.py                 # a class of 8, 1 round
    .venv/bin/python bench/bench_grading_sandbox.py --students 30   # a bigger class
    .venv/bin/python bench/bench_grading_sandbox.py --assignment A4 # engines, the wire audited
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_grader.cells import answer_id  # noqa: E402
from course_grader.grade import GradingLimits  # noqa: E402
from course_grader.gradebook import grade_folder  # noqa: E402
from course_grader.sandbox.config import SandboxLimits, sandbox_problem  # noqa: E402

SOURCES = ROOT / "assignments" / "source"


def write_class(folder: Path, size: int, assignment: str = "A1") -> None:
    """Write ``size`` submissions with the instructor's answers (every one gets full points)."""
    (path,) = SOURCES.glob(f"{assignment}_*.ipynb")
    source = nbformat.read(path, as_version=4)
    for i in range(size):
        nb = copy.deepcopy(source)
        for cell in nb.cells:
            if cell.cell_type == "code" and not answer_id(cell):
                cell.outputs = []
        (folder / f"student{i:02d}").mkdir(parents=True)
        nbformat.write(nb, folder / f"student{i:02d}" / path.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a class of 6, one round")
    assignments = sorted(path.name.split("_")[0] for path in SOURCES.glob("A*_*.ipynb"))
    parser.add_argument("--assignment", default="A1", choices=assignments)
    args = parser.parse_args()
    if args.quick:
        args.students, args.rounds = 6, 1
    problem = sandbox_problem()
    if problem is not None:
        print(f"no sandbox on this machine ({problem}): nothing to compare")
        return 1
    limits = GradingLimits(cell_seconds=120, total_seconds=900)
    times: dict[str, list[float]] = {"unisolated": [], "sandboxed": [], "no CPU share": []}
    modes = [("unisolated", None), ("sandboxed", SandboxLimits()),
             ("no CPU share", SandboxLimits(share=False))]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        write_class(Path(tmp) / "class", args.students, args.assignment)
        for _ in range(args.rounds):
            for mode, sandbox in modes:
                started = time.perf_counter()
                rows = grade_folder(
                    Path(tmp) / "class",
                    SOURCES,
                    limits,
                    jobs=args.jobs,
                    progress=False,
                    sandbox=sandbox,
                )
                times[mode].append(time.perf_counter() - started)
                full = sum(r.points == r.max_points for r in rows)
                print(
                    f"{mode:>10}: {times[mode][-1]:6.1f} s for {args.students} "
                    f"{args.assignment} notebooks "
                    f"({times[mode][-1] / args.students:.1f} s each), {full}/{len(rows)} "
                    "exercises at full points",
                    flush=True,
                )
                for row in [r for r in rows if r.points != r.max_points][:3]:  # right answers all
                    print(f"    {row.student} {row.exercise}: {row.reason[:300]}", flush=True)
    base, boxed, bare = (statistics.median(times[m]) for m, _ in modes)
    print(
        f"median over {args.rounds} round(s), {args.jobs} at once: unisolated {base:.1f} s, "
        f"sandboxed {boxed:.1f} s, ratio {boxed / base:.2f} (target <= 1.3); the sandboxes' "
        f"control groups (CPU share, memory): {boxed - bare:+.1f} s ({bare:.1f} s without)"
    )
    from course_grader.gradebook import load_sources
    from course_grader.selftest.selfcheck import preflight

    checked = preflight(load_sources(SOURCES), SandboxLimits(), ["A1"])
    print(
        f"self-check before grading (every assignment's imports, A1 known answer and stub): "
        f"{checked.seconds:.1f} s"
    )
    print(wire_audit_cost())
    return 0


def wire_audit_cost(reads: int = 30) -> str:
    """Time the socket table's reading (through ``nsenter``, as for a sandbox): the median."""
    import os

    from course_grader.sandbox.wire_audit import sockets, wire_problem_here

    if wire_problem_here():
        return f"bytes on the wire not audited here ({wire_problem_here()})"
    netns = f"/proc/{os.getpid()}/ns/net"
    seconds = []
    for _ in range(reads):
        started = time.perf_counter()
        sockets(netns)
        seconds.append(time.perf_counter() - started)
    each = statistics.median(seconds) * 1000
    return (
        f"socket table read through nsenter: {each:.1f} ms (median of {reads}); "
        f"about {2 * each:.0f} ms per audited probe cell"
    )


if __name__ == "__main__":
    raise SystemExit(main())
