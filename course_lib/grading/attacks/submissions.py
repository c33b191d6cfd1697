"""The attack classes' submissions: the instructor's A1 with given answers, outputs cleared."""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from course_lib.grading.cells import answer_id

__all__ = ["write_submission"]


def write_submission(
    source: nbformat.NotebookNode, folder: Path, student: str, answers: dict[str, str]
) -> Path:
    """Write ``folder/student/A1_sgd_conv.ipynb``: the source with ``answers`` and no outputs."""
    nb = copy.deepcopy(source)
    for cell in nb.cells:
        if answer_id(cell):
            cell.source = answers.get(answer_id(cell), "# no answer")
        if cell.cell_type == "code":
            cell.outputs = []
    path = folder / student / "A1_sgd_conv.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path
