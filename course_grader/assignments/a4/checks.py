"""Checks of assignment A4 (Local-SGD's weighted averaging; gossip over a directed ring).

The student's functions are sent to every engine and called there with the engine's
communicator (``comm``). Every engine rebuilds every rank's input from a fixed seed, so it can
compute the reference itself: the weighted mean in float64 (A4.1), a single-process simulation
of Local-SGD(p) on P least-squares shards, source 001's Algorithm 1 with the averaging after the
step as in Yu et al. 2018 (A4.2), and the product of the mixing matrices $(I + P_s) / 2$ applied
to the stacked vectors (A4.3).

Right numbers are not enough. The counters of each communicator tell who talked to whom:
A4.1 and A4.2 must average with one built-in allreduce of ``w.size + 1`` values per averaging
and no point-to-point message; A4.3 must send only to ``(r + s) mod P`` and receive only from
``(r - s) mod P``, one vector per step, so the library's symmetric gossip
(:func:`course_lib.collectives.gossip_step`: two partners, weights 1/3) fails on its partners.
A wrong Local-SGD result is compared with the usual mistakes (the plain mean, averaging the
gradients instead of the weights, averaging before the step) and the verdict names the match.
The inputs, references and judges are :mod:`course_grader.assignments.a4.judge`'s, shared
with the grader, which judges the engines' data in its own process
(:mod:`course_grader.assignments.a4.probe`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_grader.assignments.a4.judge import (
    A4_SIZES,
    GOSSIP_CASES,
    LOCAL_SGD_CASES,
    LR,
    MISTAKES,
    directed_distances,
    directed_gossip_matrix,
    local_sgd_shards,
    simulate_local_sgd_numpy,
)
from course_grader.assignments.engine_check import cluster_run, run_engine_check
from course_lib.checks.verdict import Verdict
from course_lib.i18n import N_, _

__all__ = [
    "A4_DETAILS",
    "A4_POINTS",
    "A4_SIZES",
    "GOSSIP_CASES",
    "LOCAL_SGD_CASES",
    "LR",
    "MISTAKES",
    "a4_detail",
    "check_directed_gossip",
    "check_local_sgd",
    "check_weighted_average",
    "directed_distances",
    "directed_gossip_matrix",
    "local_sgd_shards",
    "simulate_local_sgd_numpy",
]

A4_POINTS = {"A4.1": 3.0, "A4.2": 3.0, "A4.3": 4.0}
A4_DETAILS = {  # what a PASS says (templates, a4_detail fills them in the student's language)
    "A4.1": N_("4 ranks, one allreduce of w.size + 1 values, {sizes} sizes, float32/64"),
    "A4.2": N_("4 ranks, shards of 6, 11, 16, 21 rows, equal to one process: {runs}"),
    "A4.3": N_("P = 4 and 3, partners (r + s) and (r - s) mod P, bytes per peer, float32/64"),
}


def a4_detail(exercise: str) -> str:
    """What ``exercise``'s PASS says: the notebook's checks and the grader's say the same."""
    runs = ", ".join(_("p = {p} for {k} steps").format(p=p, k=k) for p, k in LOCAL_SGD_CASES)
    return _(A4_DETAILS[exercise]).format(sizes=len(A4_SIZES), runs=runs)


def _builtins_used(comm: Any) -> dict[str, tuple[int, int]]:
    return {
        name: (c.calls, c.bytes) for name, c in comm.stats.collectives.items() if name != "barrier"
    }


def _p2p(comm: Any) -> tuple[dict[int, int], dict[int, int]]:
    peers = comm.stats.peers
    sent = {p: s.bytes_sent for p, s in sorted(peers.items()) if s.bytes_sent or s.messages_sent}
    received = {p: s.bytes_received for p, s in sorted(peers.items()) if s.messages_received}
    return sent, received


def _run_average(fn: Callable, size: int, dtype: str, comm_name: str) -> str:
    """Run on an engine: the weighted mean of every rank's ``w``; return "" or what is wrong."""
    from IPython import get_ipython

    from course_grader.assignments.a4.checks import _builtins_used, _p2p
    from course_grader.assignments.a4.judge import average_inputs, judge_average

    comm = get_ipython().user_ns[comm_name]
    rank = comm.rank
    ws, counts = average_inputs(size, dtype, comm.world_size)
    comm.stats.reset()
    got = fn(comm, ws[rank].copy(), counts[rank])
    used = _builtins_used(comm)
    sent, received = _p2p(comm)
    return judge_average(size, dtype, rank, ws, counts, got, used, sent, received)


def _run_local_sgd(fn: Callable, period: int, num_steps: int, comm_name: str) -> str:
    """Run on an engine: Local-SGD(``period``) on this rank's shard; return "" or what is wrong."""
    import numpy as np
    from IPython import get_ipython

    from course_grader.assignments.a4.checks import _builtins_used, _p2p
    from course_grader.assignments.a4.judge import LR, judge_local_sgd, local_sgd_shards

    comm = get_ipython().user_ns[comm_name]
    rank = comm.rank
    shards = local_sgd_shards(comm.world_size)
    w0 = np.zeros(shards[0][0].shape[1])
    X, y = shards[rank]
    comm.stats.reset()
    got = fn(comm, w0.copy(), X.copy(), y.copy(), LR, period, num_steps)
    used = _builtins_used(comm)
    sent, _received = _p2p(comm)
    return judge_local_sgd(period, num_steps, rank, shards, got, used, sent)


def _run_gossip(fn: Callable, world_size: int, num_steps: int, dtype: str, comm_name: str) -> str:
    """Run on an engine: ``num_steps`` directed gossip steps; return "" or what is wrong."""
    from IPython import get_ipython

    from course_grader.assignments.a4.checks import _builtins_used, _p2p
    from course_grader.assignments.a4.judge import gossip_inputs, judge_gossip

    namespace = get_ipython().user_ns
    comm = namespace[comm_name]
    if world_size != comm.world_size:  # every rank must call subgroup; the others sit out
        # Made once per communicator: each new gloo group opens sockets, and students re-run.
        groups = namespace.setdefault("_a4_check_subgroups", {})
        key = (comm_name, id(comm), world_size)
        if key not in groups:
            groups[key] = comm.subgroup(list(range(world_size)))
        comm = groups[key]
        if comm is None:
            return ""
    rank = comm.rank
    xs = gossip_inputs(world_size)
    comm.stats.reset()
    got = fn(comm, xs[rank].astype(dtype), num_steps)
    used = _builtins_used(comm)
    sent, received = _p2p(comm)
    return judge_gossip(num_steps, dtype, rank, xs, got, used, sent, received)


def _check(
    exercise: str,
    name: str,
    fn: Callable,
    cluster: Any,
    cases: list,
    runner: Callable,
    comm_name: str,
    verbose: bool,
) -> Verdict:
    def body() -> str:
        # The function runs on the engines; under its own name there, later answers can call it.
        cluster.view.push({fn.__name__: fn}, block=True)
        for args in cases:
            for why in cluster_run(cluster, runner, fn, *args, comm_name, timeout=60):
                assert not why, why
        return a4_detail(exercise)

    points = A4_POINTS[exercise]
    return run_engine_check(
        exercise, name, cluster, body, world_size=4, max_points=points, verbose=verbose
    )


def check_weighted_average(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A4.1: ``fn(comm, w, n)`` returns $\\sum_j n_j w_j / \\sum_j n_j$ with one allreduce."""
    cases = [(size, dtype) for size in A4_SIZES for dtype in ("float32", "float64")]
    return _check("A4.1", "weighted_average", fn, cluster, cases, _run_average, comm_name, verbose)


def check_local_sgd(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A4.2: ``fn(comm, w, X, y, lr, period, num_steps)`` runs Local-SGD(p) like the reference."""
    return _check(
        "A4.2",
        "local_sgd",
        fn,
        cluster,
        list(LOCAL_SGD_CASES),
        _run_local_sgd,
        comm_name,
        verbose,
    )


def check_directed_gossip(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A4.3: ``fn(comm, x, num_steps)`` gossips over the directed ring with rotating ``s``."""
    cases = [(p, k, dtype) for p, k in GOSSIP_CASES for dtype in ("float64", "float32")]
    return _check("A4.3", "directed_gossip", fn, cluster, cases, _run_gossip, comm_name, verbose)
