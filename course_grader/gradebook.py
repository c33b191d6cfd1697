"""No lecture (the grader). Grade a folder of submissions in one go: a CSV gradebook and a feedback file per student."""

from __future__ import annotations

import csv
import io
import sys
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import nbformat

from course_grader.cells import check_id, check_points
from course_grader.grade import ExerciseResult, GradingLimits, grade_notebook, resolve_sandbox
from course_grader.sandbox.config import SandboxLimits, grader_package, kit_package
from course_grader.sandbox.integrity import EnvironmentGuard
from course_grader.verdict.probe import UNJUDGED
from course_lib.files import atomic_write_text

__all__ = [
    "UNFINISHED",
    "assignment_of",
    "find_submissions",
    "grade_folder",
    "load_sources",
    "read_unfinished",
    "write_feedback",
    "write_gradebook",
]

FIELDS = ("student", "assignment", "exercise", "points", "max_points", "reason")
#: The gradebook's first line while a run is under way (or was stopped): the next run resumes.
UNFINISHED = (
    "UNFINISHED: grading stopped before the end; grade again with the same --out to resume."
)


def load_sources(source_dir: Path) -> dict[str, nbformat.NotebookNode]:
    """Return {assignment id: pristine source notebook} for every source in ``source_dir``."""
    sources = {}
    for path in sorted(Path(source_dir).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assignment = nb.metadata.get("course", {}).get("assignment", path.stem.split("_")[0])
        sources[assignment] = nb
    if not sources:
        raise FileNotFoundError(
            f"no assignment sources (*.ipynb) in {source_dir}: pass --source FOLDER, the folder "
            "of the sources (assignments/source) or of the checking copies (assignments/checks)"
        )
    return sources


def find_submissions(folder: Path) -> list[tuple[str, Path]]:
    """Return (student, notebook) pairs: ``folder/<student>/*.ipynb`` or ``folder/<student>.ipynb``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder} is not a folder of submitted notebooks: give the folder that holds "
            "<student>/<notebook>.ipynb or <student>.ipynb"
        )
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        relative = path.relative_to(folder)
        student = relative.parts[0] if len(relative.parts) > 1 else path.stem
        found.append((student, path))
    return found


def assignment_of(path: Path, nb: nbformat.NotebookNode | None, known: Iterable[str]) -> str:
    """Return which assignment a submission is: its release stamp, else its file name."""
    if nb is not None:
        tagged = nb.metadata.get("course", {}).get("assignment")
        if tagged in known:
            return tagged
    for assignment in known:  # metadata lost (e.g. re-saved by another tool): go by file name
        if path.name.startswith(assignment) or f"_{assignment}" in path.stem:
            return assignment
    raise ValueError(
        f"{path}: cannot tell which assignment this is (known: {', '.join(known)}): keep the "
        "file name it was released with, which starts with its id (e.g. A1_sgd_conv.ipynb)"
    )


def _unjudged(
    student: str, path: Path, sources: dict[str, nbformat.NotebookNode], exc: BaseException
) -> list[ExerciseResult]:
    """0 points for each exercise of the submission, naming what the grader failed on."""
    reason = f"{UNJUDGED}: {type(exc).__name__}: {str(exc)[:200]}"
    try:
        assignment = assignment_of(path, None, sources)
    except ValueError:
        return [ExerciseResult(student, "?", "?", 0.0, 0.0, reason)]
    cells = [c for c in sources[assignment].cells if check_id(c) is not None]
    return [
        ExerciseResult(student, assignment, check_id(c), 0.0, check_points(c), reason)
        for c in cells
    ]


def _grade_one(
    student: str,
    path: Path,
    sources: dict[str, nbformat.NotebookNode],
    limits: GradingLimits,
    sandbox: SandboxLimits | None = None,
    hidden: tuple[str, ...] = (),
) -> list[ExerciseResult]:
    try:
        submission = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - a broken file is graded, not a crash of the grader
        submission, unreadable = None, f"could not read the notebook ({type(exc).__name__})"
    else:
        unreadable = ""
    try:
        assignment = assignment_of(path, submission, sources)
    except ValueError as exc:
        return [ExerciseResult(student, "?", "?", 0.0, 0.0, str(exc))]
    pristine = sources[assignment]
    if submission is None:
        return [
            ExerciseResult(student, assignment, check_id(c), 0.0, check_points(c), unreadable)
            for c in pristine.cells
            if check_id(c) is not None
        ]
    return grade_notebook(
        student, assignment, pristine, submission, limits, sandbox=sandbox, hidden=hidden
    )


def grade_folder(
    submissions: Path,
    source_dir: Path,
    limits: GradingLimits | None = None,
    jobs: int = 2,
    progress: bool = True,
    sandbox: SandboxLimits | None | str = "auto",
    hidden: tuple[str, ...] = (),
    out: Path | None = None,
    warning: str = "",
) -> list[ExerciseResult]:
    """Grade every submission under ``submissions``; return all rows, sorted by student.

    With ``out``, the gradebook (``out/gradebook.csv``, first line ``warning`` if any) and the
    feedback are written after every batch, atomically, marked unfinished until the last: a
    run that is stopped leaves every row so far, and the next run with the same ``out`` grades
    only the students missing from it. One submission that makes the grader itself fail gets
    0 for its exercises, with the reason, and the class goes on.

    Each notebook runs in a sandbox (``sandbox``: its limits, None for none, "auto" where this
    machine can) that never sees the sources, the submissions or ``hidden``. The kit, the
    sources and the venv are checked after every ``jobs`` notebooks graded together; see
    :func:`_grade_guarded` for what happens on a change.
    """
    limits = limits or GradingLimits()
    sandbox = resolve_sandbox(sandbox)
    sources = load_sources(source_dir)
    pairs = find_submissions(submissions)
    hidden = (str(source_dir), str(submissions), *hidden)
    rows: list[ExerciseResult] = []
    if out is not None:  # a run that was stopped left its rows: those students are done
        rows = read_unfinished(Path(out) / "gradebook.csv")
        done = {row.student for row in rows}
        if done:
            print(f"grading: resuming, {len(done)} students graded before", file=sys.stderr)
        pairs = [pair for pair in pairs if pair[0] not in done]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(pairs), unit="notebook", desc="grading")

    def grade(pair: tuple[str, Path]) -> list[ExerciseResult]:
        # Whatever one submission makes the grader do, it costs that student alone: the class
        # goes on, and the rows so far are written after every batch.
        try:
            return _grade_one(*pair, sources, limits, sandbox, hidden)
        except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - see above
            print(f"grading: {pair[0]}: {UNJUDGED} ({type(exc).__name__})", file=sys.stderr)
            return _unjudged(*pair, sources, exc)

    with EnvironmentGuard(kit_package(), Path(source_dir), grader=grader_package()) as guard:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for start in range(0, len(pairs), max(1, jobs)):
                batch = pairs[start : start + max(1, jobs)]
                rows.extend(_grade_guarded(batch, pool, grade, guard))
                if out is not None:
                    graded = {student for student, _ in batch}
                    _write(rows, Path(out), f"{UNFINISHED} {warning}".strip(), graded)
                if bar is not None:
                    bar.update(len(batch))
    if bar is not None:
        bar.close()
    rows = sorted(rows, key=lambda r: (r.student, r.assignment, r.exercise))
    if out is not None:
        _write(rows, Path(out), warning, None)
    return rows


def _write(rows: list[ExerciseResult], out: Path, warning: str, students: set[str] | None) -> None:
    """The gradebook of ``rows`` and the feedback of ``students`` (None: all), each atomically."""
    write_gradebook(rows, out / "gradebook.csv", warning)
    write_feedback([r for r in rows if students is None or r.student in students], out / "feedback")


def read_unfinished(path: Path) -> list[ExerciseResult]:
    """The rows of a gradebook that a stopped run left (marked :data:`UNFINISHED`); [] otherwise.

    A finished gradebook is never reused: grading again grades everyone again.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    head = text.splitlines()[:2]
    if not any(line.startswith(f"# {UNFINISHED}") for line in head):
        return []
    while text.startswith("#"):  # the marker and warning lines above the CSV
        text = text.partition("\n")[2]
    rows = []
    for record in csv.DictReader(io.StringIO(text)):
        try:
            points, most = float(record["points"]), float(record["max_points"])
            fields = [record[f] for f in ("student", "assignment", "exercise", "reason")]
        except (KeyError, TypeError, ValueError):
            continue
        rows.append(ExerciseResult(*fields[:3], points, most, fields[3]))
    return rows


def _grade_guarded(batch, pool, grade, guard: EnvironmentGuard) -> list[ExerciseResult]:
    """Grade ``batch`` at once; on a change to the kit, sources or venv, find who made it.

    The change is undone and every notebook of the batch (all graded since the last clean
    check) is graded again, one at a time with a check after each: the one whose run changes
    the environment again is the culprit, and gets 0 for each exercise with the reason.
    """
    results = list(pool.map(grade, batch))
    changed = guard.changes()
    if not changed:
        return [row for rows in results for row in rows]
    guard.restore()
    print(
        f"grading: a notebook of {', '.join(s for s, _ in batch)} changed the grading "
        f"environment ({'; '.join(changed[:3])}): restored, grading them again one by one",
        file=sys.stderr,
    )
    rows: list[ExerciseResult] = []
    for pair, first in zip(batch, results, strict=True):
        again = grade(pair) if len(batch) > 1 else first
        changed_now = guard.changes() if len(batch) > 1 else changed
        if changed_now:
            guard.restore()
            reason = f"changed the grading environment ({'; '.join(changed_now[:3])})"
            print(f"grading: {pair[0]} {reason}: 0 points, files restored", file=sys.stderr)
            again = [replace(row, points=0.0, reason=reason) for row in again]
        rows.extend(again)
    return rows


def write_gradebook(rows: list[ExerciseResult], path: Path, warning: str = "") -> None:
    """Write the gradebook CSV (student, assignment, exercise, points, max_points, reason).

    A ``warning`` (e.g. that the notebooks ran unisolated) becomes a first line ``# ...``.
    """
    buffer = io.StringIO()
    if warning:
        buffer.write(f"# {warning}\n")
    writer = csv.writer(buffer)
    writer.writerow(FIELDS)
    for row in rows:
        writer.writerow([getattr(row, field) for field in FIELDS])
    atomic_write_text(Path(path), buffer.getvalue())


def write_feedback(rows: list[ExerciseResult], folder: Path) -> list[Path]:
    """Write ``<student>.md`` per student: each exercise's points and reason, and the total."""
    by_student: dict[str, list[ExerciseResult]] = defaultdict(list)
    for row in rows:
        by_student[row.student].append(row)
    written = []
    for student, results in sorted(by_student.items()):
        got = sum(r.points for r in results)
        total = sum(r.max_points for r in results)
        lines = [f"# Feedback for {student}", "", f"Total: {got:g} / {total:g} points", ""]
        lines += [
            f"- {r.assignment} exercise {r.exercise}: {r.points:g} / {r.max_points:g} — {r.reason}"
            for r in results
        ]
        path = Path(folder) / f"{student}.md"
        atomic_write_text(path, "\n".join(lines) + "\n")
        written.append(path)
    return written
