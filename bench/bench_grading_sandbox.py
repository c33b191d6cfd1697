"""Benchmark grading with and without the sandbox: the same class of submissions, side by side.

Writes N correct submissions of one assignment (A1 by default; ``--assignment A4`` for one
whose engines talk, and whose bytes on the wire the sandboxed grading also counts), grades them
unisolated, sandboxed, and sandboxed without the control groups, in interleaved rounds
(``course_lib.timing``; ``--rounds`` of them, 2 notebooks at once as ``./kit grade`` does), and
prints the seconds per class with the machine's load, the sandboxed / unisolated ratio of the
medians (issue 35's aim: at most 1.1) with the sentence the spreads support, and what the
sandboxes' control groups (their CPU share and memory limit, :mod:`course_grader.sandbox.cgroup`)
cost. Every mode runs the integrity checks after each pair of notebooks and decides the verdicts
in the grader (probes); sandboxed, A1's kernel has no torch and no kit, and A2-A7's kernels see
the kit with their answers cut out (:mod:`course_grader.sandbox.kit_cut`). Then it times the
grader's self-check (``course_grader.selftest.selfcheck.preflight``), which ``./kit grade`` runs
once before the first student, and the reading of a sandbox's socket table that the bytes on the
wire rest on (:mod:`course_grader.sandbox.wire_audit`: twice per probe cell of A2-A7's exercises
whose engines talk).

    .venv/bin/python bench/bench_grading_sandbox.py                 # a class of 8, 1 round (--rounds 3: 3)
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
from collections.abc import Callable
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_grader.cells import answer_id  # noqa: E402
from course_grader.grade import GradingLimits  # noqa: E402
from course_grader.gradebook import grade_folder  # noqa: E402
from course_grader.sandbox.config import SandboxLimits, sandbox_problem  # noqa: E402
from course_lib import timing  # noqa: E402

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
    modes = {"unisolated": None, "sandboxed": SandboxLimits(),
             "no CPU share": SandboxLimits(share=False)}  # fmt: skip
    print(f"before: {timing.load_line()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        write_class(Path(tmp) / "class", args.students, args.assignment)

        def grade(mode: str) -> Callable[[], None]:
            def run() -> None:
                started = time.perf_counter()
                rows = grade_folder(Path(tmp) / "class", SOURCES, limits, jobs=args.jobs,
                                    progress=False, sandbox=modes[mode])  # fmt: skip
                full = sum(r.points == r.max_points for r in rows)
                print(f"{mode:>12}: {time.perf_counter() - started:6.1f} s for {args.students} "
                      f"{args.assignment} notebooks, {full}/{len(rows)} exercises at full points "
                      f"({timing.load_line()})", flush=True)  # fmt: skip
                for row in [r for r in rows if r.points != r.max_points][:3]:  # all right answers
                    print(f"    {row.student} {row.exercise}: {row.reason[:300]}", flush=True)

            return run

        # Interleaved rounds (unisolated, sandboxed, no CPU share; again ...): a burst of load
        # hits every mode alike. No warm-up round: a class takes minutes.
        spreads = timing.interleaved_rounds({m: grade(m) for m in modes}, args.rounds, warmup=0)
    base, boxed, bare = (spreads[m].median for m in modes)
    print(
        f"median of {args.rounds} interleaved round(s), {args.jobs} notebooks at once: unisolated "
        f"{base:.1f} s, sandboxed {boxed:.1f} s, ratio {boxed / base:.2f} (aim <= 1.1); the "
        f"sandboxes' control groups (CPU share, memory): {boxed - bare:+.1f} s ({bare:.1f} s "
        f"without)"
    )
    unit = {"unit": "s", "scale": 1.0}
    print(timing.compare("unisolated", spreads["unisolated"], "sandboxed", spreads["sandboxed"],
                         quantity="a class's grading", **unit).sentence)  # fmt: skip
    print(timing.compare("no CPU share", spreads["no CPU share"], "sandboxed",
                         spreads["sandboxed"], quantity="a class's grading", **unit).sentence)  # fmt: skip
    print(f"after: {timing.load_line()}", flush=True)
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
