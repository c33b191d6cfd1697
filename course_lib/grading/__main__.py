"""Command line: ``python -m course_lib.grading release | grade | check`` (also ``./kit ...``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from course_lib.grading.grade import GradingLimits, grade_notebook
from course_lib.grading.gradebook import (
    assignment_of,
    grade_folder,
    load_sources,
    write_feedback,
    write_gradebook,
)
from course_lib.grading.release import release_all

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "assignments" / "source"
RELEASED = ROOT / "notebooks" / "assignments"


def main(argv: list[str] | None = None) -> int:
    """Release assignments, grade a folder of submissions, or check one notebook."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="turn every source into the student notebook")
    rel.add_argument("--source", type=Path, default=SOURCES)
    rel.add_argument("--dest", type=Path, default=RELEASED)
    gra = sub.add_parser("grade", help="grade a folder of submitted notebooks")
    gra.add_argument("submissions", type=Path, help="<folder>/<student>/*.ipynb or <student>.ipynb")
    gra.add_argument("--out", type=Path, default=Path("grades"), help="gradebook.csv + feedback/")
    chk = sub.add_parser("check", help="grade one notebook the way the grader will")
    chk.add_argument("notebook", type=Path)
    for p in (gra, chk):
        p.add_argument("--source", type=Path, default=SOURCES)
        p.add_argument(
            "--cell-timeout", type=float, default=60.0,
            help="seconds per cell (a set-up cell that runs out gets one retry with twice this)",
        )  # fmt: skip
        p.add_argument("--total-timeout", type=float, default=600.0, help="seconds per notebook")
    gra.add_argument("--jobs", type=int, default=2, help="notebooks graded at once")
    args = parser.parse_args(argv)

    if args.command == "release":
        for path in release_all(args.source, args.dest):
            print(f"released {path}")
        return 0
    limits = GradingLimits(args.cell_timeout, args.total_timeout)
    started = time.perf_counter()
    if args.command == "grade":
        rows = grade_folder(args.submissions, args.source, limits, jobs=args.jobs)
        write_gradebook(rows, args.out / "gradebook.csv")
        feedback = write_feedback(rows, args.out / "feedback")
        students = len(feedback)
        print(f"graded {students} students in {time.perf_counter() - started:.0f} s: "
              f"{args.out / 'gradebook.csv'}, {args.out / 'feedback'}/")  # fmt: skip
        return 0
    import nbformat

    sources = load_sources(args.source)
    nb = nbformat.read(args.notebook, as_version=4)
    assignment = assignment_of(args.notebook, nb, sources)
    rows = grade_notebook("you", assignment, sources[assignment], nb, limits)
    for row in rows:
        print(f"{row.assignment} exercise {row.exercise}: {row.points:g}/{row.max_points:g} "
              f"— {row.reason}")  # fmt: skip
    print(f"total {sum(r.points for r in rows):g}/{sum(r.max_points for r in rows):g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
