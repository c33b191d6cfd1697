"""No lecture (the grader). Release: turn an instructor's assignment source into the notebook students get.

Two copies come out of each source. The student notebook (answers stubbed, no outputs) is what
students work in. The checking copy is what ``./kit check`` grades a student's notebook against
where the sources stay private: the source with every answer stubbed and every stored output
dropped except those nbval compares (the check cells' PASS lines), so it holds the grader's
exact checks and verdicts but no solution.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import nbformat

from course_grader.cells import (
    CHECK_MARKER,
    UNGRADED_HINT,
    answer_id,
    has_solution,
    output_is_compared,
    stub_solution,
)
from course_lib.files import atomic_write_text

__all__ = [
    "checking_copy",
    "release_all",
    "release_checks",
    "release_notebook",
    "write_notebook_atomically",
]

CHECKING_NOTE = (
    "**Checking copy of assignment {assignment}: do not work in this notebook.** "
    "`./kit check YOUR_NOTEBOOK` runs your answer cells inside it, exactly as the grader runs "
    "them inside the instructor's copy; it holds the checks and their PASS lines, no solutions."
)


def write_notebook_atomically(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` to ``path`` through a temporary file, so a crash never leaves half a file."""
    text = nbformat.writes(nb)
    atomic_write_text(path, text if text.endswith("\n") else text + "\n")  # as nbformat.write


def release_notebook(source: nbformat.NotebookNode, assignment: str) -> nbformat.NotebookNode:
    """Return the student copy: solutions stubbed, outputs cleared, checks kept (unmarked).

    Answer cells keep their metadata (the grader finds them by it). Cells lose their outputs
    and the ``# NBVAL_CHECK_OUTPUT`` line, which only makes sense beside a stored output, except
    cells tagged ``keep-output``: they keep what students must see. What the instructor's run
    recorded about itself goes: the widgets' saved state (progress bars of a finished run) and
    each cell's execution timestamps.
    """
    released = copy.deepcopy(source)
    released.metadata.pop("widgets", None)
    for cell in released.cells:
        cell.metadata.pop("execution", None)
        exercise = answer_id(cell)
        if cell.cell_type != "code":
            continue
        if exercise is not None:
            hint = cell.metadata["course"].get("hint", "write your answer here")
            cell.source = stub_solution(cell.source, exercise, hint)
        elif has_solution(cell.source):
            raise ValueError(
                f"a cell outside the answer cells holds a solution region: {cell.source[:60]!r}; "
                'mark it as an answer cell (metadata {"course": {"answer": "<id>"}})'
            )
        if "keep-output" not in cell.metadata.get("tags", []):
            # Without its stored output, a cell marked for output checking would fail nbval.
            cell.source = "\n".join(
                line for line in cell.source.splitlines() if line.strip() != CHECK_MARKER
            )
            cell.outputs = []
            cell.execution_count = None
    released.metadata["course"] = {"assignment": assignment, "source_sha256": _digest(source)}
    return released


def _digest(source: nbformat.NotebookNode) -> str:
    return hashlib.sha256(nbformat.writes(source).encode()).hexdigest()[:12]


def checking_copy(source: nbformat.NotebookNode, assignment: str) -> nbformat.NotebookNode:
    """Return the solution-free checking copy of ``source`` for ``./kit check``.

    Answer cells hold the stub the grader gives a missing answer, so an answer put into either
    copy makes the same notebook; the stored outputs nbval compares (the check cells' verdicts)
    stay, every other output goes (an answer's output could show what the solution computes).
    The notebook's own metadata (forbidden imports) stays; the instructor's run records go.
    """
    checks = copy.deepcopy(source)
    checks.metadata.pop("widgets", None)
    for cell in checks.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        exercise = answer_id(cell)
        if exercise is not None:
            cell.source = stub_solution(cell.source, exercise, UNGRADED_HINT)
        elif has_solution(cell.source):
            raise ValueError(
                f"a cell outside the answer cells holds a solution region: {cell.source[:60]!r}; "
                'mark it as an answer cell (metadata {"course": {"answer": "<id>"}})'
            )
        if exercise is not None or not output_is_compared(cell):
            cell.outputs = []
            cell.execution_count = None
    note = nbformat.v4.new_markdown_cell(CHECKING_NOTE.format(assignment=assignment))
    if checks.get("nbformat_minor", 0) >= 5:
        note["id"] = "checking-copy-note"  # fixed, so a re-release writes the same file
    else:
        note.pop("id", None)
    checks.cells.insert(0, note)
    course = dict(checks.metadata.get("course", {}), assignment=assignment)
    checks.metadata["course"] = dict(course, source_sha256=_digest(source), checking_copy=True)
    return checks


def _release_each(source_dir: Path, dest_dir: Path, make) -> list[Path]:
    written = []
    for path in sorted(Path(source_dir).glob("*.ipynb")):
        source = nbformat.read(path, as_version=4)
        assignment = source.metadata.get("course", {}).get("assignment", path.stem.split("_")[0])
        target = Path(dest_dir) / path.name
        write_notebook_atomically(make(source, assignment), target)
        written.append(target)
    if not written:
        raise FileNotFoundError(
            f"no assignment sources (*.ipynb) in {source_dir}: pass --source FOLDER"
        )
    return written


def release_all(source_dir: Path, dest_dir: Path) -> list[Path]:
    """Release every ``*.ipynb`` in ``source_dir`` into ``dest_dir``; return the written paths."""
    return _release_each(source_dir, dest_dir, release_notebook)


def release_checks(source_dir: Path, dest_dir: Path) -> list[Path]:
    """Write the checking copy of every source in ``source_dir`` into ``dest_dir``."""
    return _release_each(source_dir, dest_dir, checking_copy)
