"""Checks of assignment A6 (a row-parallel linear layer's autograd; a GPipe step), on engines.

The student's functions travel to every engine by value (cloudpickle) and run there with the
engine's communicator. Every engine rebuilds the same inputs and weights from a fixed seed and
computes the one-process reference itself: ``X @ W.T + b`` and its gradients through a full
``nn.Linear``-like product (A6.1, A6.2), the whole model's full-batch gradients and SGD steps
(A6.3, A6.4). The layer's input width 7 splits 3, 2, 2 over the 3 ranks: uneven shards.

Right numbers are not enough. The counters of each communicator tell who talked to whom: the
row-parallel forward must cost one allreduce of the output and nothing else, its backward one
allgather of this rank's slice of dL/dX (padded to the widest slice); a GPipe stage sends m
activations to the next stage and m gradients to the previous one, each of a micro-batch's
size, and calls no collective. The stage the check hands to the step records the order of its
forward and backward passes, so a naive schedule (F B F B) fails A6.3 although its gradients
are right. Wrong numbers are compared with the usual mistakes and the verdict names the match.

What runs on the engines lives in :mod:`course_lib.checks.assignments.a6_row_parallel` (A6.1, A6.2) and
:mod:`course_lib.checks.assignments.a6_gpipe` (A6.3, A6.4), which share :mod:`course_lib.checks.assignments.a6_counters`;
this module sends an exercise's cases to the engines and turns what they found into the verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.checks.assignments.a6_counters import TRAIN_STEPS
from course_lib.checks.assignments.a6_gpipe import PIPELINE_CASES, PIPELINE_WIDTHS, pipeline_model
from course_lib.checks.assignments.a6_row_parallel import ROW_PARALLEL_CASES
from course_lib.checks.verdict import Verdict, reraise_stub, run_check

__all__ = [
    "A6_POINTS",
    "PIPELINE_WIDTHS",
    "ROW_PARALLEL_CASES",
    "check_gpipe_step",
    "check_gpipe_training",
    "check_row_parallel_backward",
    "check_row_parallel_forward",
    "pipeline_model",
]

A6_POINTS = {"A6.1": 2.0, "A6.2": 3.0, "A6.3": 3.0, "A6.4": 2.0}


def _run(blob: bytes, exercise: str, comm_name: str) -> str:
    """Run on an engine: every case of ``exercise``; return "" or what is wrong on this rank."""
    import cloudpickle
    from IPython import get_ipython

    from course_lib.checks.assignments import a6_counters, a6_gpipe, a6_row_parallel

    comm, fns = get_ipython().user_ns[comm_name], cloudpickle.loads(blob)
    if exercise in ("A6.1", "A6.2"):
        backward = fns[1] if exercise == "A6.2" else None
        cases = [
            lambda c=c: a6_row_parallel.row_parallel_case(comm, fns[0], backward, *c)
            for c in a6_row_parallel.ROW_PARALLEL_CASES
        ]
        if backward is not None:
            cases.append(lambda: a6_row_parallel.row_parallel_training(comm, *fns))
    elif exercise == "A6.3":
        cases = [
            lambda k=k, c=c: a6_gpipe.pipeline_case(comm, fns, *c, seed=k)
            for k, c in enumerate(a6_gpipe.PIPELINE_CASES)
        ]
    else:
        cases = [lambda: a6_gpipe.pipeline_training(comm, fns)]
    for case in cases:
        why = a6_counters.agree(comm, case())
        if why:
            return why
    return ""


# -- the check cells ------------------------------------------------------------------------------


def _check(
    exercise: str, name: str, payload: Any, cluster: Any, detail: str, comm_name: str, verbose: bool
) -> Verdict:
    def body() -> str:
        import cloudpickle

        assert cluster.world_size == 3, f"the check needs 3 engines, not {cluster.world_size}"
        blob = cloudpickle.dumps(payload)  # by value: notebook functions and their helpers
        try:
            reasons = cluster.run(_run, blob, exercise, comm_name, timeout=120)
        except Exception as exc:
            reraise_stub(exc)
            raise
        # A rank that only saw another rank's problem comes last: show the problem itself.
        problems = sorted((w for w in reasons if w), key=lambda w: w.startswith("another rank"))
        assert not problems, problems[0]
        return detail

    return run_check(exercise, name, body, max_points=A6_POINTS[exercise], verbose=verbose)


def check_row_parallel_forward(
    forward: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A6.1: ``forward(ctx, X, W_shard, b, comm, bounds)`` is X @ W.T + b with one allreduce."""
    detail = "3 ranks, 3 shapes (7 inputs split 3, 2, 2), one allreduce of the output"
    return _check("A6.1", "row_parallel_forward", (forward,), cluster, detail, comm_name, verbose)


def check_row_parallel_backward(
    forward: Callable,
    backward: Callable,
    cluster: Any,
    *,
    comm_name: str = "comm",
    verbose: bool = True,
) -> Verdict:
    """A6.2: ``backward(ctx, dY)``: dX, dW_shard, db with one allgather; trains like one process."""
    detail = (
        f"3 ranks, 3 shapes, dX / dW / db with one allgather, an MLP trained "
        f"{TRAIN_STEPS} steps equal to one process"
    )
    return _check(
        "A6.2", "row_parallel_backward", (forward, backward), cluster, detail, comm_name, verbose
    )


def check_gpipe_step(
    step: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A6.3: ``step(comm, stage, X, y, m, shapes)`` is one GPipe step with one-process gradients."""
    cases = ", ".join(f"batch {b} in m = {m}" for b, m in PIPELINE_CASES)
    detail = f"3 stages, {cases}: gradients and loss of one process, neighbours only, F..F B..B"
    return _check("A6.3", "gpipe_step", step, cluster, detail, comm_name, verbose)


def check_gpipe_training(
    train: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A6.4: ``train(comm, stage, batches, lr, m, shapes)`` ends with the weights of one process."""
    detail = f"3 stages, m = 4, {TRAIN_STEPS} SGD steps with momentum: the weights of one process"
    return _check("A6.4", "gpipe_training", train, cluster, detail, comm_name, verbose)
