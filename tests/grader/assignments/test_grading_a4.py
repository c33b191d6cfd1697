"""A4 graded out of the kernel's reach (:mod:`course_grader.assignments.a4.probe`).

Fast: the grader's half alone, on probe lines written here as the kernel would print them (right
data passes, the plain mean, a forgotten rank or a point-to-point message fails with the
notebook's reason). Slow: real kernels and engines under nbval: the instructor's source gets full
marks, the released stub none, and each typical mistake loses only its own exercise, with the
reason that names it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from probe_lines import probe_line

from course_grader.assignments.a4.checks import A4_POINTS
from course_grader.assignments.a4.judge import average_inputs
from course_grader.assignments.a4.probe import a4_cases, a4_spec
from course_grader.cells import answer_id
from course_grader.grade import GradingLimits, grade_notebook
from course_grader.verdict.probe import judge

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "assignments" / "source" / "A4_local_sgd_gossip.ipynb"
RELEASED = ROOT / "notebooks" / "assignments" / "A4_local_sgd_gossip.ipynb"
LIMITS = GradingLimits(cell_seconds=90, total_seconds=600)
SEED = 1234


def _average_ranks(case: dict, *, plain: bool = False, p2p: bool = False) -> list[tuple]:
    """Every rank's data for one A4.1 case: the weighted (or plain) mean, one allreduce."""
    ws, counts = average_inputs(case["size"], case["dtype"], 4, SEED)
    weights = np.ones(4) if plain else np.array(counts, float)
    mean = sum(c * w.astype(float) for c, w in zip(weights, ws, strict=True)) / weights.sum()
    nbytes = (case["size"] + 1) * np.dtype(case["dtype"]).itemsize
    sent = [[1, 8]] if p2p else []
    return [
        (r, 4, mean.astype(case["dtype"]), [["allreduce", 1, nbytes]], sent if r == 0 else [], [])
        for r in range(4)
    ]


def test_the_grader_judges_a4_1_from_data_with_the_notebooks_reasons():
    spec, cases = a4_spec(), a4_cases("average", SEED)
    assert judge(spec, "A4.1", SEED, probe_line([_average_ranks(c) for c in cases])) == (
        True,
        "PASS",
    )
    passed, reason = judge(
        spec, "A4.1", SEED, probe_line([_average_ranks(c, plain=True) for c in cases])
    )
    assert not passed and reason == (
        "FAIL (size 1 (float32): the result on rank 0 is wrong "
        "(that is the plain mean; weight each rank's w by its n))"
    ), reason
    passed, reason = judge(
        spec, "A4.1", SEED, probe_line([_average_ranks(c, p2p=True) for c in cases])
    )
    assert (
        not passed
        and reason == "FAIL (rank 0 sent point-to-point messages to [1]; use the allreduce)"
    )
    # Right numbers for another seed's inputs (results held from an earlier run) fail.
    passed, reason = judge(spec, "A4.1", SEED + 1, probe_line([_average_ranks(c) for c in cases]))
    assert not passed and "the result on rank 0 is wrong" in reason, reason
    three = [_average_ranks(c)[:3] for c in cases]
    passed, reason = judge(spec, "A4.1", SEED, probe_line(three))
    assert reason == "FAIL (the engines' results do not come one from each rank)", reason
    passed, reason = judge(
        spec, "A4.1", SEED, probe_line([[(r, 2, None, [], [], []) for r in range(2)]])
    )
    assert reason == "FAIL (the check needs 4 engines, not 2)", reason


def _with_answers(nb: nbformat.NotebookNode, answers: dict[str, str]) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if answer_id(cell) in answers:
            cell.source = answers[answer_id(cell)]
    return nb


# Typical mistakes, one per exercise; each answer cell is otherwise the source's.
AVERAGES_BEFORE_THE_STEP = """
def local_sgd(comm, w, X, y, lr, period, num_steps):
    for k in range(num_steps):
        grad = X.T @ (X @ w - y) / len(y)
        if (k + 1) % period == 0:
            w = weighted_average(comm, w, len(y))
        w = w - lr * grad
    return w
"""
NEVER_ROTATES = """
def directed_gossip(comm, x, num_steps):
    r, p = comm.rank, comm.world_size
    incoming = np.empty_like(x)
    for _ in range(num_steps):
        comm.sendrecv(x, (r + 1) % p, incoming, (r - 1) % p)
        x += incoming
        x /= 2
    return x
"""


@pytest.mark.slow
def test_a4_source_full_marks_stub_none_and_each_mistake_costs_only_its_exercise():
    source = nbformat.read(SOURCE, as_version=4)
    rows = grade_notebook("teacher", "A4", source, source, LIMITS)
    assert {r.exercise: r.points for r in rows} == A4_POINTS, rows
    assert all(r.reason == "PASS" for r in rows), rows
    rows = grade_notebook("blank", "A4", source, nbformat.read(RELEASED, as_version=4), LIMITS)
    assert {r.exercise: r.points for r in rows} == dict.fromkeys(A4_POINTS, 0.0), rows
    for row in rows:
        assert row.reason.startswith(f"FAIL (not implemented yet: Exercise {row.exercise}"), row
    submission = _with_answers(source, {"A4.2": AVERAGES_BEFORE_THE_STEP, "A4.3": NEVER_ROTATES})
    rows = {r.exercise: r for r in grade_notebook("typical", "A4", source, submission, LIMITS)}
    assert {ex: r.points for ex, r in rows.items()} == dict(A4_POINTS, **{"A4.2": 0.0, "A4.3": 0.0})
    assert re.fullmatch(
        r"FAIL \(Local-SGD\(1\), 4 steps: rank 0's weights match averaging before the step "
        r"\(source 001's Algorithm 1 as written\): average after every p-th step\)",
        rows["A4.2"].reason,
    ), rows["A4.2"].reason
    assert re.fullmatch(
        r"FAIL \(P = 4, 5 steps, s = \[1, 2, 1, 2, 1\]: rank 0 sent to ranks \[1\] and received "
        r"from \[3\]; on the directed ring .*\)",
        rows["A4.3"].reason,
    ), rows["A4.3"].reason
