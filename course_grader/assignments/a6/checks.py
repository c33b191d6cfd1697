"""Checks of assignment A6 (a row-parallel linear layer's autograd; a GPipe step), on engines.

The student's functions travel to every engine by value (cloudpickle) and run there with the
engine's communicator. Every engine rebuilds the same inputs and weights from a seed, runs the
answer and returns what it produced and its communicator's counters, as data
(:mod:`course_grader.assignments.a6.collect`); the judges rebuild the inputs and compute the
one-process reference themselves: ``X @ W.T + b`` and its gradients through a full
``nn.Linear``-like product (A6.1, A6.2), the whole model's full-batch gradients and SGD steps
(A6.3, A6.4). The layer's input width 7 splits 3, 2, 2 over the 3 ranks: uneven shards.

Right numbers are not enough. The counters of each communicator tell who talked to whom: the
row-parallel forward must cost one allreduce of the output and nothing else, its backward one
allgather of this rank's slice of dL/dX (padded to the widest slice); a GPipe stage sends m
activations to the next stage and m gradients to the previous one, each of a micro-batch's
size, and calls no collective. The stage the check hands to the step records the order of its
forward and backward passes, so a naive schedule (F B F B) fails A6.3 although its gradients
are right. Wrong numbers are compared with the usual mistakes and the verdict names the match.

The judges live in :mod:`course_grader.assignments.a6.row_parallel` (A6.1, A6.2) and
:mod:`course_grader.assignments.a6.gpipe` (A6.3, A6.4); :func:`a6_body` runs an exercise's
cases and judges every rank, here in the kernel and in the grader's process for ``./kit grade``
(:mod:`course_grader.assignments.a6.probe`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from course_grader.assignments.a6.collect import TRAIN_STEPS
from course_grader.assignments.a6.gpipe import (
    PIPELINE_CASES,
    PIPELINE_WIDTHS,
    judge_pipeline,
    judge_pipeline_training,
    pipeline_cases,
    pipeline_model,
    training_cases,
)
from course_grader.assignments.a6.row_parallel import (
    ROW_PARALLEL_CASES,
    judge_row_parallel,
    judge_row_training,
    row_parallel_cases,
)
from course_grader.assignments.engine_check import judge_ranks, run_shipped_check
from course_lib.checks.verdict import Verdict
from course_lib.i18n import N_, _

__all__ = [
    "A6_DETAILS",
    "A6_POINTS",
    "PIPELINE_WIDTHS",
    "ROW_PARALLEL_CASES",
    "a6_body",
    "a6_cases",
    "a6_detail",
    "check_gpipe_step",
    "check_gpipe_training",
    "check_row_parallel_backward",
    "check_row_parallel_forward",
    "pipeline_model",
]

A6_POINTS = {"A6.1": 2.0, "A6.2": 3.0, "A6.3": 3.0, "A6.4": 2.0}
#: what each exercise's PASS line says (templates: :func:`a6_detail` fills in the numbers)
A6_DETAILS = {
    "A6.1": N_("3 ranks, 3 shapes (7 inputs split 3, 2, 2), one allreduce of the output"),
    "A6.2": N_(
        "3 ranks, 3 shapes, dX / dW / db with one allgather, an MLP trained "
        "{steps} steps equal to one process"
    ),
    "A6.3": N_(
        "3 stages, {pipeline}: gradients and loss of one process, neighbours only, F..F B..B"
    ),
    "A6.4": N_("3 stages, m = 4, {steps} SGD steps with momentum: the weights of one process"),
}


def a6_detail(exercise: str) -> str:
    """``exercise``'s PASS detail in the current language."""
    pipeline = ", ".join(_("batch {b} in m = {m}").format(b=b, m=m) for b, m in PIPELINE_CASES)
    return _(A6_DETAILS[exercise]).format(steps=TRAIN_STEPS, pipeline=pipeline)


def a6_cases(exercise: str, seed: int | None = None) -> list[dict]:
    """The cases of ``exercise`` the engines run (``seed`` None: the notebook's own)."""
    if exercise in ("A6.1", "A6.2"):
        return row_parallel_cases(exercise == "A6.2", seed)
    return pipeline_cases(seed) if exercise == "A6.3" else training_cases(seed)


def _judge_rank(exercise: str, case: dict, rank: int, world_size: int, data: Any) -> str:
    if case["kind"] == "row":
        return judge_row_parallel(case, rank, world_size, data, exercise == "A6.2")
    if case["kind"] == "row_training":
        return judge_row_training(case, rank, world_size, data)
    if case["kind"] == "pipeline":
        return judge_pipeline(case, rank, world_size, data)
    return judge_pipeline_training(case, rank, world_size, data)


def a6_body(exercise: str, run_case: Callable[[dict], Any], seed: int | None = None) -> str:
    """Judge ``run_case(case)`` (every rank's (rank, world size, data)) case by case."""

    judge = functools.partial(_judge_rank, exercise)
    judge_ranks(a6_cases(exercise, seed), run_case, judge, world_size=3)
    return a6_detail(exercise)


def _run(blob: bytes, case: dict, comm_name: str) -> tuple:
    """Run on an engine: one case with this engine's communicator; return its data."""
    import cloudpickle
    from IPython import get_ipython

    from course_grader.assignments.a6.collect import collect

    return collect(get_ipython().user_ns[comm_name], cloudpickle.loads(blob), case)


# -- the check cells ------------------------------------------------------------------------------


#: ``_check(exercise, name, answer, cluster, comm_name, verbose)``: the check cells' verdict
_check = functools.partial(run_shipped_check, body=a6_body, task=_run, points=A6_POINTS)


def check_row_parallel_forward(
    forward: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A6.1: ``forward(ctx, X, W_shard, b, comm, bounds)`` is X @ W.T + b with one allreduce."""
    return _check("A6.1", "row_parallel_forward", (forward,), cluster, comm_name, verbose)


def check_row_parallel_backward(
    forward: Callable,
    backward: Callable,
    cluster: Any,
    *,
    comm_name: str = "comm",
    verbose: bool = True,
) -> Verdict:
    """A6.2: ``backward(ctx, dY)``: dX, dW_shard, db with one allgather; trains like one process."""
    return _check("A6.2", "row_parallel_backward", (forward, backward), cluster, comm_name, verbose)


def check_gpipe_step(
    step: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A6.3: ``step(comm, stage, X, y, m, shapes)`` is one GPipe step with one-process gradients."""
    return _check("A6.3", "gpipe_step", step, cluster, comm_name, verbose)


def check_gpipe_training(
    train: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A6.4: ``train(comm, stage, batches, lr, m, shapes)`` ends with the weights of one process."""
    return _check("A6.4", "gpipe_training", train, cluster, comm_name, verbose)
