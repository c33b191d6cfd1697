"""Release: turn an instructor's assignment source into the notebook students get."""

from __future__ import annotations

import copy
import hashlib
import os
import tempfile
from pathlib import Path

import nbformat

from course_lib.grading.cells import CHECK_MARKER, answer_id, has_solution, stub_solution

__all__ = ["release_notebook", "release_all", "write_notebook_atomically"]


def write_notebook_atomically(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` to ``path`` through a temporary file, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".ipynb.tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            nbformat.write(nb, handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    digest = hashlib.sha256(nbformat.writes(source).encode()).hexdigest()[:12]
    released.metadata["course"] = {"assignment": assignment, "source_sha256": digest}
    return released


def release_all(source_dir: Path, dest_dir: Path) -> list[Path]:
    """Release every ``*.ipynb`` in ``source_dir`` into ``dest_dir``; return the written paths."""
    written = []
    for path in sorted(Path(source_dir).glob("*.ipynb")):
        source = nbformat.read(path, as_version=4)
        assignment = source.metadata.get("course", {}).get("assignment", path.stem.split("_")[0])
        target = Path(dest_dir) / path.name
        write_notebook_atomically(release_notebook(source, assignment), target)
        written.append(target)
    if not written:
        raise FileNotFoundError(f"no assignment sources (*.ipynb) in {source_dir}")
    return written
