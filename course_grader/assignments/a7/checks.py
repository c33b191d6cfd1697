"""Checks of assignment A7 (ZeRO stage 2's sharded step from point-to-point), on engines.

The student's functions travel to every engine by value (cloudpickle) and run there with the
engine's communicator. Every engine rebuilds the same inputs from a seed, runs the answer and
returns what it produced, its communicator's counters and the ledger's count of the state it
keeps, as data (:mod:`course_grader.assignments.a7.collect`); the judge
(:mod:`course_grader.assignments.a7.judge`) redoes the arithmetic in one process and
compares bit for bit: the ring's reduce-scatter of a bucket into this rank's shard of the mean
(A7.1), the shard's Adam update (A7.2), the ring's allgather of the updated shards (A7.3), and
the whole stage-2 step trained 3 steps on a two-bucket MLP (A7.4). Buckets of 35 and 16 values
on 3 ranks: uneven shards.

:func:`a7_body` runs an exercise's cases and judges every rank, here in the kernel and in the
grader's process for ``./kit grade`` (:mod:`course_grader.assignments.a7.probe`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from course_grader.assignments.a7.collect import TRAIN_STEPS
from course_grader.assignments.a7.judge import a7_cases, judge_rank
from course_grader.assignments.engine_check import judge_ranks, run_shipped_check
from course_lib.checks.verdict import Verdict

__all__ = [
    "A7_DETAILS",
    "A7_POINTS",
    "a7_body",
    "a7_cases",
    "check_allgather_shards",
    "check_reduce_scatter_mean",
    "check_shard_adam",
    "check_stage2_step",
]

A7_POINTS = {"A7.1": 3.0, "A7.2": 2.0, "A7.3": 2.0, "A7.4": 3.0}
#: what each exercise's PASS line says
A7_DETAILS = {
    "A7.1": "3 ranks, buckets of 35 and 16 values (uneven shards): the mean bit for bit, "
    "a ring of (N - 1)/N of the bucket per rank",
    "A7.2": f"3 ranks, {TRAIN_STEPS} Adam steps: torch.optim.Adam's bits, state for the shard only",
    "A7.3": "3 ranks, buckets of 35 and 16 values: every owner's shard, (N - 1)/N of the bucket "
    "per rank",
    "A7.4": f"3 ranks, {TRAIN_STEPS} steps, 2 buckets: the weights of one process bit for bit, "
    "the ring's bytes, the shard's state only",
}


def a7_body(exercise: str, run_case: Callable[[dict], Any], seed: int | None = None) -> str:
    """Judge ``run_case(case)`` (every rank's (rank, world size, data)) case by case."""

    judge = functools.partial(judge_rank, exercise)
    judge_ranks(a7_cases(exercise, seed), run_case, judge, world_size=3)
    return A7_DETAILS[exercise]


#: The kit's ring answers A7.1 and A7.3: refused on the engines while the answer runs (graded,
#: the guard refuses importing it; the notebook's check says so at once).
REFUSED = {
    f"course_lib.collectives.ring.{name}": "write the ring yourself from comm.sendrecv"
    for name in ("ring_reduce_scatter", "ring_allgather", "ring_allreduce")
}


def _run(blob: bytes, case: dict, comm_name: str) -> tuple:
    """Run on an engine: one case with this engine's communicator; return its data."""
    import cloudpickle
    from IPython import get_ipython

    from course_grader.assignments.a7.collect import collect
    from course_lib.checks.verdict import refusing

    answer = cloudpickle.loads(blob)
    with refusing(REFUSED, answer):
        return collect(get_ipython().user_ns[comm_name], answer, case)


#: ``_check(exercise, name, answer, cluster, comm_name, verbose)``: the check cells' verdict
_check = functools.partial(run_shipped_check, body=a7_body, task=_run, points=A7_POINTS)


def check_reduce_scatter_mean(
    reduce_scatter_mean: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A7.1: ``reduce_scatter_mean(comm, flat)`` is this rank's shard of the mean, by a ring."""
    return _check("A7.1", "reduce_scatter_mean", reduce_scatter_mean, cluster, comm_name, verbose)


def check_shard_adam(
    adam_on_shard: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A7.2: ``adam_on_shard(flat_params, grad_shard, state, comm, lr)``: Adam on the shard only."""
    return _check("A7.2", "adam_on_shard", adam_on_shard, cluster, comm_name, verbose)


def check_allgather_shards(
    allgather_shards: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A7.3: ``allgather_shards(comm, flat)`` fills ``flat`` with every owner's shard, by a ring."""
    return _check("A7.3", "allgather_shards", allgather_shards, cluster, comm_name, verbose)


def check_stage2_step(
    stage2_step: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A7.4: ``stage2_step(comm, flat_params, flat_grad, state, lr)`` trains like one process."""
    return _check("A7.4", "stage2_step", stage2_step, cluster, comm_name, verbose)
