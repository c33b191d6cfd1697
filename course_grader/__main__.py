"""Command line: ``python -m course_grader release | grade | check | selftest``.

Also ``./kit release``, ``./kit grade``, ``./kit check``; ``./kit grade --self-test`` runs
``selftest``: a small class with attackers, graded in the sandbox, and what held. Before grading,
``grade`` checks the grading machine itself for every assignment among the submissions
(:mod:`course_grader.selftest.selfcheck`; a pass is remembered in the user's cache folder until the
kit, the source, the versions or the sandbox settings change) and stops with one line, exit
status 3, when it cannot grade.

``release`` writes the student notebooks and the solution-free checking copies
(``assignments/checks``); ``check`` grades one notebook against the instructor's sources where
they are, else against the checking copies, so a course can keep its sources private. Bad input
gets one line that names the fix, and exit status 2. No lecture: the grader's plumbing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from course_grader import lean_nbformat  # noqa: F401 - first: nbformat without the IRI grammar
from course_grader.grade import GradingLimits, grade_notebook
from course_grader.gradebook import (
    assignment_of,
    grade_folder,
    load_sources,
    write_feedback,
    write_gradebook,
)
from course_grader.release import release_all, release_checks
from course_grader.sandbox.config import SandboxLimits, sandbox_problem
from course_grader.sandbox.wire_audit import wire_problem_here

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "assignments" / "source"
CHECKS = ROOT / "assignments" / "checks"
RELEASED = ROOT / "notebooks" / "assignments"


class InputError(Exception):
    """Bad input to a job: its message names the fix."""


def main(argv: list[str] | None = None) -> int:
    """Run one job; bad input prints one line that names the fix and returns 2."""
    import nbformat

    try:
        return _main(argv)
    except (InputError, ValueError, FileNotFoundError, nbformat.ValidationError) as exc:
        print(f"kit: {exc}", file=sys.stderr)
        return 2


def _read_notebook(path: Path) -> Any:
    """Read the notebook at ``path``, or raise InputError saying what to give instead."""
    import nbformat

    if not path.is_file():
        raise InputError(f"{path} does not exist: give the path of your saved notebook (.ipynb)")
    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - JSON, schema or encoding: all mean "not a notebook"
        raise InputError(
            f"{path} is not a readable notebook ({type(exc).__name__}): give the .ipynb file "
            "that JupyterLab saved (File > Save Notebook), not a copy or an export"
        ) from None


def _check_sources(given: Path | None) -> tuple[Path, str]:
    """Return the folder ``check`` grades against and what it is: sources, else checking copies."""
    if given is not None:
        return given, str(given)
    if any(SOURCES.glob("*.ipynb")):
        return SOURCES, "the instructor's sources"
    if any(CHECKS.glob("*.ipynb")):
        return CHECKS, "the checking copies"
    raise InputError(
        f"neither assignment sources ({SOURCES}) nor checking copies ({CHECKS}) are here: "
        "get assignments/checks from your instructor (./kit release writes them)"
    )


def _main(argv: list[str] | None = None) -> int:
    """Release assignments, grade a folder of submissions, or check one notebook."""
    parser = argparse.ArgumentParser(prog="python -m course_grader", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="turn every source into the student notebook")
    rel.add_argument("--source", type=Path, default=SOURCES)
    rel.add_argument("--dest", type=Path, default=RELEASED)
    rel.add_argument(
        "--checks-dest",
        type=Path,
        default=CHECKS,
        help="where the solution-free checking copies go",
    )
    gra = sub.add_parser("grade", help="grade a folder of submitted notebooks")
    gra.add_argument("submissions", type=Path, help="<folder>/<student>/*.ipynb or <student>.ipynb")
    gra.add_argument("--out", type=Path, default=Path("grades"), help="gradebook.csv + feedback/")
    chk = sub.add_parser("check", help="grade one notebook the way the grader will")
    chk.add_argument("notebook", type=Path)
    gra.add_argument("--source", type=Path, default=SOURCES)
    chk.add_argument(
        "--source",
        type=Path,
        default=None,
        help="sources or checking copies (default: assignments/source, else assignments/checks)",
    )
    for p in (gra, chk):
        p.add_argument(
            "--cell-timeout",
            type=float,
            default=60.0,
            help="seconds per cell (a set-up cell that runs out gets one retry with twice this)",
        )
        p.add_argument("--total-timeout", type=float, default=600.0, help="seconds per notebook")
    gra.add_argument("--jobs", type=int, default=2, help="notebooks graded at once")
    gra.add_argument(
        "--self-check-cache",
        type=Path,
        default=None,
        help="where passed self-checks are remembered (default: the user's cache folder)",
    )
    gra.add_argument(
        "--fresh-self-check",
        action="store_true",
        help="check the grading machine for every assignment again, ignoring the cache",
    )
    gra.add_argument("--no-sandbox", action="store_true", help="run the notebooks unisolated")
    gra.add_argument(
        "--require-sandbox",
        action="store_true",
        help="refuse to grade where no sandbox can be made (instead of grading unisolated)",
    )
    defaults = SandboxLimits()
    for name, unit in (
        ("memory", "MB of address space per process"),
        ("processes", "processes and threads per notebook"),
        ("cpu-time", "CPU seconds per process"),
        ("disk", "MB of /tmp"),
    ):
        field = {"memory": "memory_mb", "cpu-time": "cpu_seconds", "disk": "disk_mb"}.get(
            name, name
        )
        gra.add_argument(
            f"--{name}",
            type=int,
            default=getattr(defaults, field),
            dest=field,
            help=f"sandbox limit: {unit} (default %(default)s)",
        )
    sel = sub.add_parser("selftest", help="grade a class with attackers; print what held")
    sel.add_argument("--keep", type=Path, default=None, help="keep the class and grades here")
    args = parser.parse_args(argv)

    if args.command == "release":
        for path in release_all(args.source, args.dest):
            print(f"released {path}")
        for path in release_checks(args.source, args.checks_dest):
            print(f"checking copy {path}")
        return 0
    if args.command == "selftest":
        from course_grader.selftest.attacks.sandbox import self_test

        return self_test(args.keep)
    limits = GradingLimits(args.cell_timeout, args.total_timeout)
    started = time.perf_counter()
    if args.command == "grade":
        sandbox, warning = _choose_sandbox(args)
        if sandbox is False:
            return 2
        from course_grader.selftest.selfcheck import (
            GradingMachineError,
            assignments_to_grade,
            default_cache,
            preflight,
        )

        sources = load_sources(args.source)
        cache = None if args.fresh_self_check else (args.self_check_cache or default_cache())
        try:  # the assignments of this class, through the whole path, before anyone is graded
            checked = preflight(
                sources,
                sandbox,
                assignments_to_grade(args.submissions, sources),
                max(args.cell_timeout, 120),
                cache=cache,
                jobs=args.jobs,
            )
        except GradingMachineError as exc:
            print(f"grade: {exc}", file=sys.stderr)
            return 3
        print(checked.summary(), flush=True)
        rows = grade_folder(
            args.submissions,
            args.source,
            limits,
            jobs=args.jobs,
            sandbox=sandbox,
            hidden=(str(args.out),),
            out=args.out,
            warning=warning,
        )
        write_gradebook(rows, args.out / "gradebook.csv", warning)
        feedback = write_feedback(rows, args.out / "feedback")
        students = len(feedback)
        print(
            f"graded {students} students in {time.perf_counter() - started:.0f} s: "
            f"{args.out / 'gradebook.csv'}, {args.out / 'feedback'}/"
        )
        if warning:
            print(f"WARNING: {warning}", file=sys.stderr)
        return 0
    nb = _read_notebook(args.notebook)
    folder, what = _check_sources(args.source)
    sources = load_sources(folder)
    assignment = assignment_of(args.notebook, nb, sources)
    print(f"checking {args.notebook} ({assignment}) against {what}")
    # The notebook's own inputs (seed 0): a student checking their work sees the same verdicts
    # every run; ``grade`` draws a fresh seed, so no answer can hold results for them.
    rows = grade_notebook("you", assignment, sources[assignment], nb, limits, seed=0)
    for row in rows:
        print(
            f"{row.assignment} exercise {row.exercise}: {row.points:g}/{row.max_points:g} "
            f"— {row.reason}"
        )
    print(f"total {sum(r.points for r in rows):g}/{sum(r.max_points for r in rows):g}")
    return 0


def _choose_sandbox(args: argparse.Namespace) -> tuple[SandboxLimits | None | bool, str]:
    """Return (sandbox limits, or None to run unisolated, or False to refuse; a warning)."""
    problem = "--no-sandbox was given" if args.no_sandbox else sandbox_problem()
    if problem is None:
        try:
            limits = SandboxLimits(args.memory_mb, args.processes, args.cpu_seconds, args.disk_mb)
        except ValueError as exc:
            print(f"grade: {exc}", file=sys.stderr)
            return False, ""
        unaudited = wire_problem_here()
        if unaudited:  # the ranks' own counters then decide the byte checks (A2, A7) alone
            print(
                f"note: the bytes between engines are not counted on the wire ({unaudited}); "
                "grade as root to hold the ranks' reported bytes against them",
                file=sys.stderr,
            )
        return limits, ""
    warning = (
        f"GRADED UNISOLATED ({problem}): answers ran with the grader's rights and could read "
        "the solutions; the kit, sources and venv were checked after each notebook"
    )
    if args.require_sandbox:
        print(
            f"grade: no sandbox can be made here ({problem}); --require-sandbox refuses "
            "to grade without one: grade on Linux with namespaces enabled",
            file=sys.stderr,
        )
        return False, warning
    print(f"WARNING: {warning}", file=sys.stderr)
    return None, warning


if __name__ == "__main__":
    raise SystemExit(main())
