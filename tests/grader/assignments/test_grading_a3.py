"""A3 graded out of the kernel's reach (:mod:`course_grader.assignments.a3.probe`).

Fast: the grader's half alone, on probe lines written here as the kernel would print them: a
right parameter server and training run pass, source 000's published combination and a run that
misses one process's weights fail with the notebook's reasons; the bucket layout's answers are
judged from the buckets alone. Slow: real kernels and engines under nbval: the instructor's
source gets full marks, the released stub none, and each typical mistake loses only its own
exercise, with the reason that names it (A3.2's behind a forged verdict: it wins nothing, as
when the checks ran in the kernel it won 2 points). The kernel is shown, of ``course_lib/checks``, only the
data collector ``a3_engine``.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
from probe_lines import probe_line

from course_grader.assignments.a3.checks import A3_POINTS, PROBE_SIZES, PS_CASES, layout_cases
from course_grader.assignments.a3.engine import a3net_sizes, probe_gradients
from course_grader.assignments.a3.judge import (
    reference_layout,
    reference_weights,
    ring_bytes_bounds,
    sharded_ps_bytes,
)
from course_grader.assignments.a3.probe import a3_spec, kit_hidden
from course_grader.cells import answer_id
from course_grader.grade import GradingLimits, grade_notebook
from course_grader.verdict.probe import judge
from course_lib.comm import chunk_bounds
from course_lib.parallel.exchanges.parameter_server import source000_combine

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "assignments" / "source" / "A3_data_parallel.ipynb"
RELEASED = ROOT / "notebooks" / "assignments" / "A3_data_parallel.ipynb"
LIMITS = GradingLimits(cell_seconds=240, total_seconds=900)
SEED = 77


def _ps_ranks(size: int, server: int, *, source000: bool = False) -> list[tuple]:
    """Every rank's data for one A3.1 probe: the mean (or source 000's, shard by shard), the
    sharded parameter server's bytes."""
    grads = probe_gradients(size, 4, SEED)
    mean = np.sum(grads, axis=0) / 4
    if source000:
        for q, (a, b) in enumerate(chunk_bounds(size, 4)):
            owner = (server + q) % 4
            others = [g[a:b] for r, g in enumerate(grads) if r != owner]
            mean[a:b] = source000_combine(grads[owner][a:b], others)
    ranks = []
    for rank in range(4):
        sent = sorted(sharded_ps_bytes(size, 4, server, rank).items())
        ranks.append((rank, 4, mean.astype(np.float32), [], sent, sent))
    return ranks


def _ps_training(*, off: float = 0.0) -> tuple:
    """A run's data: rank 0's weights (the reference's, plus ``off``), the sharded server's bytes
    a step, and each rank's counts of the set-up and the steps (here none: no wire is read)."""
    weights = [(k, w + off) for k, w in sorted(reference_weights(SEED).items())]
    gradient_bytes = 4 * sum(a3net_sizes())
    values = gradient_bytes // 4
    records = [
        [rank, step, sum(sharded_ps_bytes(values, 4, 1, rank).values()), 0]
        for step in range(10)
        for rank in range(4)
    ]
    return (4, 1, 0.0, gradient_bytes, 0, weights, records, [])


def test_the_grader_judges_a3_1_from_data_with_the_notebooks_reasons():
    spec = a3_spec()
    right = [_ps_ranks(size, server) for size, server in PS_CASES]
    passed, reason = judge(spec, "A3.1", SEED, probe_line([*right, _ps_training()]))
    assert (passed, reason) == (True, "PASS"), reason
    wrong = [_ps_ranks(size, server, source000=True) for size, server in PS_CASES]
    passed, reason = judge(spec, "A3.1", SEED, probe_line([*wrong, _ps_training()]))
    assert not passed and reason.startswith(
        "FAIL (size 1, server rank 0: rank 0 holds source 000's published combination"
    ), reason
    passed, reason = judge(spec, "A3.1", SEED, probe_line([*right, _ps_training(off=1e-2)]))
    assert not passed and "agree with each other but not with one process" in reason, reason
    # The right numbers for another seed's gradients (held from an earlier run) fail.
    passed, reason = judge(spec, "A3.1", SEED + 1, probe_line([*right, _ps_training()]))
    assert not passed and "server rank 0: rank 0" in reason, reason


def _ring_ranks(size: int, *, whole_buffers: bool = False) -> list[tuple]:
    """Every rank's data for one A3.3 probe: the mean, sent to r + 1, received from r - 1."""
    mean = (np.sum(probe_gradients(size, 4, SEED), axis=0) / 4).astype(np.float32)
    nbytes = 3 * size * 4 if whole_buffers else ring_bytes_bounds(size, 4)[0]
    return [(r, 4, mean, [], [((r + 1) % 4, nbytes)], [((r - 1) % 4, nbytes)]) for r in range(4)]


def test_the_grader_judges_a3_3_probes_from_data_with_the_notebooks_reasons():
    spec = a3_spec()
    whole = [_ring_ranks(size, whole_buffers=True) for size in PROBE_SIZES]
    passed, reason = judge(spec, "A3.3", SEED, probe_line(whole))
    assert reason == (
        "FAIL (size 1: rank 0 sent 12 bytes; a ring allreduce sends 2(N-1)/N of the buffer, "
        "0 to 8 bytes here: one chunk of S/N per step, N - 1 steps of reduce-scatter then N - 1 "
        "of allgather)"
    ), reason
    right = [_ring_ranks(size) for size in PROBE_SIZES]
    passed, reason = judge(
        spec, "A3.3", SEED, probe_line(right)
    )  # the probes pass; no training run
    assert reason == "FAIL (the answer returned no result for this case)", reason
    passed, reason = judge(spec, "A3.3", SEED, probe_line([*right, "trained"]))
    assert reason == "FAIL (the training run returned no result)", reason


def test_the_grader_judges_a3_2_from_the_buckets_alone():
    spec = a3_spec()
    layouts = [reference_layout(sizes, cap) for sizes, cap in layout_cases(SEED)]
    assert judge(spec, "A3.2", SEED, probe_line(["ValueError"] * 2 + layouts)) == (True, "PASS")
    forward = [  # the same rule, first to last
        [[len(sizes) - 1 - i for i in b] for b in reference_layout(sizes[::-1], cap)]
        for sizes, cap in layout_cases(SEED)
    ]
    passed, reason = judge(spec, "A3.2", SEED, probe_line(["ValueError"] * 2 + forward))
    assert not passed and "start from the last parameter" in reason, reason
    passed, reason = judge(spec, "A3.2", SEED, probe_line(["no error", "ValueError", *layouts]))
    assert reason == ("FAIL (bucket_bytes=0 must raise ValueError (a bucket holds bytes))"), reason


def test_the_kernel_is_shown_of_the_grader_only_the_data_collector():
    import course_grader

    grader = Path(course_grader.__file__).resolve().parent
    hidden = set(kit_hidden())
    assert "course_lib/checks" in hidden  # the lecture checks and the verdicts
    for path in grader.rglob("*.py"):
        part = f"course_grader/{path.relative_to(grader).as_posix()}"
        if "__pycache__" in part:
            continue
        # The packages on the way to the collector, and the collector.
        shown = part in {
            "course_grader/__init__.py",
            "course_grader/assignments/__init__.py",
            "course_grader/assignments/a3/__init__.py",
            "course_grader/assignments/a3/engine.py",
        }
        assert (part not in hidden) == shown, part
    assert {"course_grader/assignments/a3/judge.py", "course_grader/grade.py"} <= hidden
    # The collector decides nothing: importing it loads neither the judges nor the verdicts.
    code = (
        "import sys, course_grader.assignments.a3.engine as e; "
        "print(sorted(m for m in sys.modules if m.startswith(('course_lib.checks', 'course_grader'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.split() == [
        "['course_grader',",
        "'course_grader.assignments',",
        "'course_grader.assignments.a3',",
        "'course_grader.assignments.a3.engine']",
    ], loaded
    assert set(a3_spec().kit_hidden) == hidden


def _with_answers(nb: nbformat.NotebookNode, answers: dict[str, str]) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if answer_id(cell) in answers:
            cell.source = answers[answer_id(cell)]
    return nb


def _source_answer(nb: nbformat.NotebookNode, exercise: str, *edits: tuple[str, str]) -> str:
    code = next(c.source for c in nb.cells if answer_id(c) == exercise)
    for old, new in edits:
        assert old in code, (exercise, old)
        code = code.replace(old, new)
    return code


@pytest.mark.slow
def test_a3_source_full_marks_stub_none_and_each_mistake_costs_only_its_exercise():
    source = nbformat.read(SOURCE, as_version=4)
    rows = grade_notebook("teacher", "A3", source, source, LIMITS)
    assert {r.exercise: r.points for r in rows} == A3_POINTS, rows
    assert all(r.reason == "PASS" for r in rows), rows
    rows = grade_notebook("blank", "A3", source, nbformat.read(RELEASED, as_version=4), LIMITS)
    assert {r.exercise: r.points for r in rows} == dict.fromkeys(A3_POINTS, 0.0), rows
    for row in rows:
        assert row.reason.startswith("FAIL (not implemented yet: Exercise A3"), row
    # Source 000's published averaging (A3.1) and buckets from the first parameter (A3.2).
    source000 = _source_answer(
        source,
        "A3.1",
        (
            "    mean = parts[0].copy()\n    for q in range(1, n):  # rank order: the same sum "
            "whatever arrives first\n        mean += parts[q]\n    mean /= n  # once, over all N parts\n",
            "    mean = parts[r].copy()\n    for q in range(n):\n        if q != r:\n"
            "            mean /= n - 1\n            mean += parts[q] / (n - 1)\n",
        ),
    )
    # A3.2: buckets from the first parameter, behind the in-kernel route that won its points when
    # the checks ran in the kernel (its check replaced by one returning a forged verdict): one run
    # shows that each mistake costs only its exercise and that the route wins nothing.
    from course_grader.cells import check_id
    from course_grader.selftest.attacks.submissions import A3_ATTACKS
    from course_grader.verdict.guard import rejected_answers

    prefix, _, forward, _ = A3_ATTACKS["A3.2"]
    pass_line = next(c.outputs[0]["text"].strip() for c in source.cells if check_id(c) == "A3.2")
    forward = prefix.format(pass_line=pass_line) + forward
    assert not rejected_answers(source, {"A3.2": forward})  # past the guard
    submission = _with_answers(source, {"A3.1": source000, "A3.2": forward})
    rows = {r.exercise: r for r in grade_notebook("typical", "A3", source, submission, LIMITS)}
    got = {ex: r.points for ex, r in rows.items()}
    assert got == dict(A3_POINTS, **{"A3.1": 0.0, "A3.2": 0.0}), rows
    # On the grader's fresh seed another mistake may give the same values: it is named beside.
    assert re.match(
        r"FAIL \(size 1, server rank 0: rank \d holds (.*; equally, )?source 000's published "
        r"combination",
        rows["A3.1"].reason,
    ), rows["A3.1"].reason
    assert "start from the last parameter" in rows["A3.2"].reason, rows["A3.2"].reason


def test_a3_judge_names_every_mistake_that_gives_the_same_values():
    # 26 g0 = g1 + 3 g2 + 9 g3: source 000's combination leaves the server its own gradient, so on
    # these values "nothing was exchanged" is as true; the verdict names both, never one alone.
    from course_grader.assignments.a3.judge import judge_probe
    from course_lib.parallel.exchanges.parameter_server import source000_combine

    grads = [np.array([v], np.float32) for v in (0.0, 3.0, -1.0, 0.0)]
    got = source000_combine(grads[0], grads[1:])
    peers = {r: 4 for r in (1, 2, 3)}
    reason = judge_probe("ps", 1, 0, 0, grads, got, [], peers, peers)
    assert reason.startswith("size 1, server rank 0: rank 0 holds this rank's own gradient"), reason
    assert "; equally, source 000's published combination" in reason, reason
