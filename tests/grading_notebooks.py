"""Shared by the grader's end-to-end tests: the assignments' notebooks, the limits, small edits."""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import psutil

from course_grader.cells import BEGIN, END, answer_id
from course_grader.grade import GradingLimits

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "assignments" / "source"
RELEASED = ROOT / "notebooks" / "assignments"
ASSIGNMENTS = [
    "A1_sgd_conv",
    "A2_rabenseifner_allreduce",
    "A3_data_parallel",
    "A4_local_sgd_gossip",
    "A5_compression",
    "A6_model_pipeline",
    "A7_zero_stage2",
    "A8_choosing_a_strategy",
    "A9_ring_attention",
]
# Generous per cell: A2's set-up cell starts 4 engines (11 s on a quiet machine). No test here
# expects a timeout under these limits, so a generous limit costs nothing.
LIMITS = GradingLimits(cell_seconds=45, total_seconds=300)
A1_FULL = {"A1.1": 2.0, "A1.2": 3.0, "A1.3": 3.0}
A2_FULL = {"A2.1": 3.0, "A2.2": 2.0, "A2.3": 3.0}


def source_notebook(name: str) -> nbformat.NotebookNode:
    """The instructor's source of an assignment (with solutions and stored outputs)."""
    return nbformat.read(SOURCES / f"{name}.ipynb", as_version=4)


def released_notebook(name: str) -> nbformat.NotebookNode:
    """The student's released copy (stubs)."""
    return nbformat.read(RELEASED / f"{name}.ipynb", as_version=4)


def with_answer(nb: nbformat.NotebookNode, exercise: str, code: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` whose answer cell for ``exercise`` is ``code``."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if answer_id(cell) == exercise:
            cell.source = code
    return nb


def points_of(rows) -> dict[str, float]:
    """Exercise -> points of a graded notebook's rows."""
    return {row.exercise: row.points for row in rows}


def solution_lines(nb: nbformat.NotebookNode) -> list[str]:
    """Return the code lines inside every solution region of a source notebook."""
    lines = []
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            if BEGIN in line:
                inside = True
            elif END in line:
                inside = False
            elif inside and line.strip():
                lines.append(line.strip())
    return lines


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


#: A1.1's answer that rebinds the checker to print the PASS line (the guard's first case).
FORGED_VERDICT = (
    'check_smoothed_cross_entropy = lambda f: print("Exercise A1.1 smoothed_cross_entropy: PASS '
    "(loss and gradient equal to torch's label-smoothed cross-entropy in 5 cases, large logits "
    'included) [2/2 points]")'
)

#: A grader's environment in the lab: the kernel it grades must not inherit it.
ROOM_SETTINGS = {
    "COURSE_CLUSTER_PROFILE": "lab",
    "COURSE_CLUSTER_FILE": "/nonexistent/ipcontroller-client.json",
    "COURSE_CLUSTER_KIND": "connect",
    "COURSE_CLUSTER_ENGINES": "not-a-number",
}
