"""Checks of assignment A7 (ZeRO stage 2: gradient hooks that reduce-scatter and free, and the shard's update), on engines.

The student's functions travel to every engine by value (cloudpickle) and run there with the
engine's communicator. Every engine rebuilds the same inputs from a seed, runs the answer and
returns what it produced, its communicator's counters and the memory ledger, as data
(:mod:`course_grader.assignments.a7.collect`); the judge
(:mod:`course_grader.assignments.a7.judge`) redoes the arithmetic in one process and compares:
the shards the hooks store during two backward passes of a 3-bucket MLP, with the full-size
gradient bytes held at every parameter's gradient (A7.1), and the shard's Adam update with the
allgather of the updated shards, buckets of 35 and 16 values on 3 ranks (A7.2). The ring itself
was A3's: the built-in reduce-scatter and allgather are allowed here.

:func:`a7_body` runs an exercise's cases and judges every rank, here in the kernel and in the
grader's process for ``./kit grade`` (:mod:`course_grader.assignments.a7.probe`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from course_grader.assignments.a7.collect import BACKWARDS, TRAIN_STEPS
from course_grader.assignments.a7.judge import a7_cases, judge_rank
from course_grader.assignments.engine_check import judge_ranks, run_shipped_check
from course_lib.checks.verdict import Verdict
from course_lib.i18n import N_, _

__all__ = [
    "A7_DETAILS",
    "A7_POINTS",
    "a7_body",
    "a7_cases",
    "a7_detail",
    "check_shard_update",
    "check_stage2_hooks",
]

A7_POINTS = {"A7.1": 6.0, "A7.2": 4.0}
#: what each exercise's PASS line says (templates: :func:`a7_detail` fills in the numbers)
A7_DETAILS = {
    "A7.1": N_(
        "3 ranks, 3 buckets, {backwards} backward passes: every shard of the mean, each "
        "bucket reduced during backward and its full gradients freed (at most one bucket's held)"
    ),
    "A7.2": N_(
        "3 ranks, buckets of 35 and 16 values, {steps} steps: torch.optim.Adam's "
        "weights on every rank, state for the shard only"
    ),
}


def a7_detail(exercise: str) -> str:
    """``exercise``'s PASS detail in the current language."""
    return _(A7_DETAILS[exercise]).format(backwards=BACKWARDS, steps=TRAIN_STEPS)


def a7_body(exercise: str, run_case: Callable[[dict], Any], seed: int | None = None) -> str:
    """Judge ``run_case(case)`` (every rank's (rank, world size, data)) case by case."""

    judge = functools.partial(judge_rank, exercise)
    judge_ranks(a7_cases(exercise, seed), run_case, judge, world_size=3)
    return a7_detail(exercise)


#: The kit's stage 2 answers A7.1 with its hooks: refused on the engines while the answer runs
#: (graded, the guard refuses importing it).
REFUSED = {
    "course_lib.parallel.sharded.zero.Zero2.attach": N_("register the hooks yourself"),
}


def _run(blob: bytes, case: dict, comm_name: str) -> tuple:
    """Run on an engine: one case with this engine's communicator; return its data."""
    import cloudpickle
    from IPython import get_ipython

    from course_grader.assignments.a7.collect import collect
    from course_lib.checks.verdict import refusing

    answer = cloudpickle.loads(blob)
    with refusing({name: _(hint) for name, hint in REFUSED.items()}, answer):
        return collect(get_ipython().user_ns[comm_name], answer, case)


#: ``_check(exercise, name, answer, cluster, comm_name, verbose)``: the check cells' verdict
_check = functools.partial(run_shipped_check, body=a7_body, task=_run, points=A7_POINTS)


def check_stage2_hooks(
    attach_stage2_hooks: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A7.1: ``attach_stage2_hooks(comm, buckets, shards)``: shards of the mean during backward."""
    return _check("A7.1", "attach_stage2_hooks", attach_stage2_hooks, cluster, comm_name, verbose)


def check_shard_update(
    update_shard: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A7.2: ``update_shard(comm, flat_params, grad_shard, state, lr)``: Adam, then gather."""
    return _check("A7.2", "update_shard", update_shard, cluster, comm_name, verbose)
