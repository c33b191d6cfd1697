"""A6's checks on real engines: the instructor's answers pass; stubs and the tempting wrong answers
(no allreduce, the bias on every rank, no gather in the backward, dY reduced again, an allreduce
where an allgather does, a naive schedule, losses not divided by m, gradients zeroed between
micro-batches or kept between steps) fail with the verdict that says why."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from course_grader.assignments.a6.checks import (
    A6_POINTS,
    check_gpipe_step,
    check_gpipe_training,
    check_row_parallel_backward,
    check_row_parallel_forward,
)
from course_grader.cells import answer_id

SOURCE = Path(__file__).resolve().parents[3] / "assignments" / "source" / "A6_model_pipeline.ipynb"
ANSWERS = {
    answer_id(c): c.source for c in nbformat.read(SOURCE, as_version=4).cells if answer_id(c)
}


def _define(answers: dict[str, str]) -> dict:
    """Run answer code as a notebook would: in ``__main__``, with the set-up cell's names."""
    namespace = {"__name__": "__main__", "torch": torch, "F": F}
    for exercise in sorted(answers):
        exec(answers[exercise], namespace)
    return namespace


def _mutant(exercise: str, *edits: tuple[str, str]) -> dict:
    """Return the namespace of every answer, with ``exercise``'s answer edited."""
    codes = dict(ANSWERS)
    for old, new in edits:
        assert old in codes[exercise], f"the solution of {exercise} no longer holds {old!r}"
        codes[exercise] = codes[exercise].replace(old, new)
    return _define(codes)


SOLUTION = _define(ANSWERS)


def stub(*args):
    raise NotImplementedError("Exercise A6.x: write your answer here")


def _run(check, *fns, cluster) -> str:
    verdict = check(*fns, cluster, verbose=False)
    full = A6_POINTS[verdict.exercise]
    assert (verdict.points, verdict.max_points) == ((full if verdict.passed else 0.0), full)
    return f"{'PASS' if verdict.passed else 'FAIL'} {verdict.detail}"


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cl = shared_engines(3)  # from the session's pool (tests/conftest.py)
    setup_communicators(cl, backend="gloo", timeout=20)
    cl.view.execute("import torch", block=True)
    return cl


GATHER = (
    "    slices = comm.allgather(padded)  # (P, batch, widest)\n"
    "    dX = torch.cat([slices[r, :, : hi - lo] for r, (lo, hi) in enumerate(bounds)], dim=1)\n"
)
LOCAL_DX = (
    "    dX = torch.zeros(dY.shape[0], bounds[-1][1])\n"
    "    lo, hi = bounds[comm.rank]\n"
    "    dX[:, lo:hi] = dY @ W_shard\n"
)
NAIVE_SCHEDULE = '''
def gpipe_step(comm, stage, X, y, num_microbatches, shapes):
    """Right gradients, one micro-batch at a time: F0 B0 F1 B1 ..."""
    s, p, m = comm.rank, comm.world_size, num_microbatches
    loss = 0.0
    for i in range(m):
        x = X.chunk(m)[i] if s == 0 else comm.recv(torch.empty(shapes[s]), s - 1).requires_grad_()
        out = stage(x)
        if s == p - 1:
            out = F.cross_entropy(out, y.chunk(m)[i]) / m
            loss += out.item()
            out.backward()
        else:
            comm.send(out.detach(), s + 1)
            out.backward(comm.recv(torch.empty(shapes[s + 1]), s + 1))
        if s > 0:
            comm.send(x.grad, s - 1)
    return loss if s == p - 1 else None
'''


@pytest.mark.slow
def test_a6_checks_pass_the_source_and_fail_stubs_and_the_usual_mistakes(cluster):
    sol = SOLUTION
    checks = [
        (check_row_parallel_forward, (sol["row_parallel_forward"],), "A6.1"),
        (
            check_row_parallel_backward,
            (sol["row_parallel_forward"], sol["row_parallel_backward"]),
            "A6.2",
        ),
        (check_gpipe_step, (sol["gpipe_step"],), "A6.3"),
        (check_gpipe_training, (sol["train_pipeline"],), "A6.4"),
    ]
    for check, fns, exercise in checks:
        assert re.match(r"PASS 3 (ranks|stages)", _run(check, *fns, cluster=cluster)), exercise
        stubs = (*fns[:-1], stub)  # A6.2's stub is the backward: the forward is A6.1's
        assert _run(check, *stubs, cluster=cluster).startswith(
            "FAIL not implemented yet: Exercise A6.x"
        )

    no_sum = _mutant("A6.1", ("    comm.allreduce(Y)  # the full product, on every rank\n", ""))
    bias_each = _mutant(
        "A6.1",
        ("Y = X_shard @ W_shard.T", "Y = X_shard @ W_shard.T + b"),
        ("return Y + b", "return Y"),
    )
    no_gather = _mutant("A6.2", (GATHER, LOCAL_DX))
    reduces_dy = _mutant(
        "A6.2",
        (
            "    comm, bounds = ctx.comm, ctx.bounds\n",
            "    comm, bounds = ctx.comm, ctx.bounds\n    dY = comm.allreduce(dY.clone())\n",
        ),
    )
    allreduce_dx = _mutant("A6.2", (GATHER, LOCAL_DX + "    comm.allreduce(dX)\n"))
    naive = _define(dict(ANSWERS, **{"A6.3": NAIVE_SCHEDULE}))
    undivided = _mutant("A6.3", ("/ m  # the batch's loss", "# the batch's loss"))
    overwrites = _mutant(
        "A6.3",
        (
            "        if last:\n            outputs[i].backward()",
            "        stage.zero_grad()\n        if last:\n            outputs[i].backward()",
        ),
    )
    keeps = _mutant("A6.4", ("        optimizer.zero_grad()", "        pass"))
    forward = sol["row_parallel_forward"]
    case = r"X \(4, 7\), W \(5, 7\), rank \d holds W\[:, \d:\d\]"
    expected = [
        (
            check_row_parallel_forward,
            (no_sum["row_parallel_forward"],),
            rf"FAIL {case}: Y is this rank's partial sum; sum the partial products over ranks",
        ),
        (
            check_row_parallel_forward,
            (bias_each["row_parallel_forward"],),
            rf"FAIL {case}: Y holds b 3 times: add the bias once, after the sum",
        ),
        (
            check_row_parallel_backward,
            (forward, no_gather["row_parallel_backward"]),
            rf"FAIL {case}: dL/dX on rank \d is right in columns \d:\d only: .*gather them",
        ),
        (
            check_row_parallel_backward,
            (forward, reduces_dy["row_parallel_backward"]),
            rf"FAIL {case}: dL/dX is 3 times too large: .* do not reduce dY",
        ),
        (
            check_row_parallel_backward,
            (forward, allreduce_dx["row_parallel_backward"]),
            rf"FAIL {case}: the backward on rank \d called \{{'allreduce': \(1, 112\)\}}, .*"
            r"\(4 x 3, 48 bytes\): the slices are disjoint, an allreduce of a padded dX moves .*",
        ),
        (
            check_gpipe_step,
            (naive["gpipe_step"],),
            r"FAIL batch 12, m = 4, stage \d: the stage ran F B F B F B F B; GPipe runs all m "
            r"forwards, then the m backwards",
        ),
        (
            check_gpipe_step,
            (undivided["gpipe_step"],),
            r"FAIL batch 12, m = 4, stage \d: the gradients are m = 4 times too large: .*",
        ),
        (
            check_gpipe_step,
            (overwrites["gpipe_step"],),
            r"FAIL batch 12, m = 4, stage \d: only the last micro-batch's gradient is left: .*",
        ),
        (
            check_gpipe_training,
            (keeps["train_pipeline"],),
            r"FAIL the gradients of earlier steps were kept: .*zero them before each step.*",
        ),
        (  # A6.4 runs the student's own A6.3 step: an undivided loss is named, not "differ"
            check_gpipe_training,
            (undivided["train_pipeline"],),
            r"FAIL the weights equal one process trained on m = 4 times the gradient: each "
            r"micro-batch's loss must be divided by m .*",
        ),
        (  # A6.2 runs the student's own A6.1 forward: a wrong forward is named as A6.1's
            check_row_parallel_backward,
            (no_sum["row_parallel_forward"], sol["row_parallel_backward"]),
            rf"FAIL {case}: Y is this rank's partial sum; .* \(the forward is your A6.1 answer: "
            r"fix A6.1 first, A6.2's check runs it\)",
        ),
    ]
    for check, fns, pattern in expected:
        got = _run(check, *fns, cluster=cluster)
        assert re.fullmatch(pattern, got), (pattern, got)


# The notebook's closing cells: the order of the student's own step, recorded on the engines,
# then simulated (they must not show the library's GPipe whatever the student wrote).
CLOSING = [
    c.source
    for c in nbformat.read(SOURCE, as_version=4).cells
    if c.cell_type == "code" and ("my_passes" in c.source or "bubble_formula" in c.source)
]


@pytest.mark.slow
def test_a6_closing_cells_simulate_the_schedule_the_student_wrote(cluster):
    assert len(CLOSING) == 2
    naive = _define(dict(ANSWERS, **{"A6.3": NAIVE_SCHEDULE}))
    for namespace, bubbles, held in (
        (SOLUTION, {1: 2 / 3, 2: 1 / 2, 4: 1 / 3, 8: 1 / 5}, {m: [m] * 3 for m in (1, 2, 4, 8)}),
        (naive, dict.fromkeys((1, 2, 4, 8), 2 / 3), dict.fromkeys((1, 2, 4, 8), [1, 1, 1])),
    ):
        ns = dict(namespace, cluster=cluster)
        for code in CLOSING:
            exec(code, ns)
        timelines = ns["timelines"]
        assert {m: round(float(t.bubble_fraction), 6) for m, t in timelines.items()} == {
            m: round(b, 6) for m, b in bubbles.items()
        }
        assert {m: t.peak_activations for m, t in timelines.items()} == held
