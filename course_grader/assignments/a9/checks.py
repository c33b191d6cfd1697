"""Checks of assignment A9 (ring attention's forward from point-to-point, with online softmax).

A9.1 runs in the kernel: the student's ``online_softmax_update`` is called on running states and
score blocks drawn from a seed, and :mod:`course_grader.assignments.a9.online` holds each new
state against the softmax over every key so far, computed in one go. A9.2 runs on 3 engines:
the student's ``ring_attention_forward`` travels to every engine by value (cloudpickle) and runs
there with the engine's communicator on its own block of queries, keys and values
(:mod:`course_grader.assignments.a9.collect`); :mod:`course_grader.assignments.a9.judge`
holds every rank's output against full causal attention over the whole sequence and its
counters against a ring of N - 1 key / value blocks. T = 11 and 16 on 3 ranks: uneven blocks.

:func:`a9_body` runs A9.2's cases and judges every rank, here in the kernel and in the grader's
process for ``./kit grade`` (:mod:`course_grader.assignments.a9.probe`); A9.1's check is the
same function in both places.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from course_grader.assignments.a9.judge import RING_CASES, a9_ring_cases, judge_ring
from course_grader.assignments.a9.online import ONLINE_CASES, judge_update, online_cases
from course_grader.assignments.engine_check import judge_ranks, run_shipped_check
from course_lib.checks.verdict import Verdict, run_check
from course_lib.i18n import N_, _

__all__ = [
    "A9_DETAILS",
    "A9_POINTS",
    "a9_body",
    "a9_cases",
    "a9_detail",
    "check_online_softmax_update",
    "check_ring_attention_forward",
    "online_cases",
]

A9_POINTS = {"A9.1": 4.0, "A9.2": 6.0}
#: what each exercise's PASS line says (templates: :func:`a9_detail` fills in the numbers)
A9_DETAILS = {
    "A9.1": N_(
        "{blocks} blocks (the first, raising and lowering the maximum, masked): "
        "the softmax over every key so far"
    ),
    "A9.2": N_(
        "3 ranks, T = {tokens} (uneven blocks): full causal attention, N - 1 key / value "
        "blocks to rank + 1 only"
    ),
}


def a9_detail(exercise: str) -> str:
    """``exercise``'s PASS detail in the current language."""
    tokens = _(" and ").join(str(case[0]) for case in RING_CASES)
    return _(A9_DETAILS[exercise]).format(blocks=len(ONLINE_CASES), tokens=tokens)


def a9_cases(exercise: str, seed: int | None = None) -> list[dict]:
    """The cases of ``exercise`` (``seed`` None: the notebook's own)."""
    return online_cases(seed) if exercise == "A9.1" else a9_ring_cases(seed)


def check_online_softmax_update(
    update: Callable, *, verbose: bool = True, seed: int | None = None
) -> Verdict:
    """A9.1: ``update(m, ell, acc, s, v) -> (m', ell', acc')``, the online softmax's block step."""

    def body() -> str:
        import numpy as np
        import torch

        for index, case in enumerate(online_cases(seed)):
            args = [torch.from_numpy(case[k].copy()) for k in ("m", "ell", "acc", "s", "v")]
            got = update(*args)
            if isinstance(got, (tuple, list)):
                got = tuple(
                    g.detach().numpy() if isinstance(g, torch.Tensor) else np.asarray(g)
                    for g in got
                )
            why = judge_update(index, case, got)
            assert not why, why
        return a9_detail("A9.1")

    return run_check(
        "A9.1", "online_softmax_update", body, max_points=A9_POINTS["A9.1"], verbose=verbose
    )


def a9_body(exercise: str, run_case: Callable[[dict], Any], seed: int | None = None) -> str:
    """Judge ``run_case(case)`` (every rank's (rank, world size, data)) case by case (A9.2)."""
    judge_ranks(a9_cases(exercise, seed), run_case, judge_ring, world_size=3)
    return a9_detail(exercise)


#: The kit's ring attention answers A9.2: refused on the engines while the answer runs (graded,
#: the guard refuses importing it; the notebook's check says so at once).
REFUSED = {
    "course_lib.parallel.transformer.ring.ring_attention": N_(
        "write the ring yourself from comm.sendrecv"
    )
}


def _run(blob: bytes, case: dict, comm_name: str) -> tuple:
    """Run on an engine: one case with this engine's communicator; return its data."""
    import cloudpickle
    from IPython import get_ipython

    from course_grader.assignments.a9.collect import collect
    from course_lib.checks.verdict import refusing

    answer = cloudpickle.loads(blob)
    with refusing({name: _(hint) for name, hint in REFUSED.items()}, answer):
        return collect(get_ipython().user_ns[comm_name], answer, case)


#: ``_check(exercise, name, answer, cluster, comm_name, verbose)``: the check cells' verdict
_check = functools.partial(run_shipped_check, body=a9_body, task=_run, points=A9_POINTS)


def check_ring_attention_forward(
    forward: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A9.2: ``forward(comm, q, k, v, T)`` is causal attention of this rank's queries, by a ring."""
    return _check("A9.2", "ring_attention_forward", forward, cluster, comm_name, verbose)
