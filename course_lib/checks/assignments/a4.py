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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.checks.verdict import Verdict, reraise_stub, run_check

__all__ = [
    "A4_POINTS",
    "check_directed_gossip",
    "check_local_sgd",
    "check_weighted_average",
    "directed_distances",
    "directed_gossip_matrix",
    "local_sgd_shards",
    "simulate_local_sgd_numpy",
]

A4_POINTS = {"A4.1": 3.0, "A4.2": 3.0, "A4.3": 4.0}
A4_SIZES = (1, 10, 1001)
LOCAL_SGD_CASES = ((1, 4), (3, 10), (4, 8))  # (period, num_steps): ends between averagings too
GOSSIP_CASES = ((4, 5), (3, 4))  # (world size, num_steps); 3 ranks: a subgroup, odd P
LR = 0.1
FEATURES = 5
# Local-SGD variants a wrong answer is compared with, and what to tell the student.
MISTAKES = {
    "mean": "the plain mean of the weights: weight each rank by its shard size n_i",
    "gradients": "averaging the gradients every p steps: Local-SGD averages the weights",
    "before": "averaging before the step (source 001's Algorithm 1 as written): average "
    "after every p-th step",
    "before_fresh": "averaging before the step: average after every p-th step",
}


def directed_distances(world_size: int, num_steps: int) -> list[int]:
    """Return the distance ``s`` of each step: 1, 2, ..., floor(P / 2), then 1 again (source 001)."""
    out, s = [], 1
    for _ in range(num_steps):
        out.append(s)
        s = 1 if s + 1 > world_size / 2 else s + 1
    return out


def directed_gossip_matrix(world_size: int, s: int) -> np.ndarray:
    """Return $(I + P_s) / 2$: row ``i`` averages rank ``i`` with rank ``(i - s) mod P``."""
    w = np.eye(world_size) / 2
    for i in range(world_size):
        w[i, (i - s) % world_size] += 0.5
    return w


def local_sgd_shards(world_size: int, seed: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    """Return every rank's ``(X, y)``: least-squares shards of unequal sizes 6 + 5 r."""
    rng = np.random.default_rng(seed)
    w_true = rng.normal(size=FEATURES)
    shards = []
    for rank in range(world_size):
        n = 6 + 5 * rank
        X = rng.normal(size=(n, FEATURES)) + rank  # each shard its own region: replicas drift
        y = X @ w_true + rng.normal(scale=0.5, size=n)
        shards.append((X, y))
    return shards


def simulate_local_sgd_numpy(
    shards: list[tuple[np.ndarray, np.ndarray]],
    w0: np.ndarray,
    lr: float,
    period: int,
    num_steps: int,
    variant: str = "right",
) -> np.ndarray:
    """Return the P replicas (rows) after ``num_steps`` steps of Local-SGD(``period``), here.

    Replica i steps with $\\nabla E_i(w) = X_i^T (X_i w - y_i) / n_i$; after every
    ``period``-th step all replicas become $\\sum_j n_j w_j / \\sum_j n_j$. ``variant`` makes one
    of the usual mistakes instead (``MISTAKES``).
    """
    n = np.array([len(y) for _, y in shards], dtype=float)
    weights = n / n.sum() if variant != "mean" else np.full(len(n), 1 / len(n))
    w = np.tile(np.asarray(w0, float), (len(shards), 1))
    for k in range(num_steps):
        sync = (k + 1) % period == 0
        if sync and variant == "before_fresh":  # average, then the gradient at the average
            w[:] = weights @ w
        grads = np.stack(
            [X.T @ (X @ wi - y) / len(y) for (X, y), wi in zip(shards, w, strict=True)]
        )
        if sync and variant == "gradients":
            grads[:] = weights @ grads
        if sync and variant == "before":  # the gradient at the local weights, then average
            w[:] = weights @ w
        w = w - lr * grads
        if sync and variant in ("right", "mean"):
            w[:] = weights @ w
    return w


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
    import numpy as np
    from IPython import get_ipython

    from course_lib.checks.assignments.a4 import _builtins_used, _p2p

    comm = get_ipython().user_ns[comm_name]
    rank, world_size = comm.rank, comm.world_size
    ws = [
        np.random.default_rng([size, r]).normal(size=size).astype(dtype) for r in range(world_size)
    ]
    counts = [3 + 7 * r for r in range(world_size)]  # unequal: the plain mean is wrong
    expected = sum(c * w.astype(float) for c, w in zip(counts, ws, strict=True)) / sum(counts)
    comm.stats.reset()
    got = fn(comm, ws[rank].copy(), counts[rank])
    if got is None:
        return f"rank {rank} returned None; return w"
    got = np.asarray(got)
    if got.shape != (size,) or got.dtype != np.dtype(dtype):
        return f"size {size}: rank {rank} returned {got.dtype}{got.shape}, w was {dtype}({size},)"
    tol = 1e-5 if dtype == "float32" else 1e-12
    if not np.allclose(got, expected, rtol=tol, atol=tol):
        plain = sum(w.astype(float) for w in ws) / world_size
        hint = (
            "that is the plain mean; weight each rank's w by its n"
            if np.allclose(got, plain, rtol=tol, atol=tol)
            else "want sum_j n_j w_j / sum_j n_j"
        )
        return f"size {size} ({dtype}): the result on rank {rank} is wrong ({hint})"
    used = _builtins_used(comm)
    want = {"allreduce": (1, (size + 1) * np.dtype(dtype).itemsize)}
    if used != want:
        return (
            f"size {size} ({dtype}): rank {rank} called {used or 'no built-in collective'}; "
            f"average with one comm.allreduce of w.size + 1 = {size + 1} values in w's dtype "
            "(n packed beside n * w): each call costs a latency"
        )
    sent, received = _p2p(comm)
    if sent or received:
        return f"rank {rank} sent point-to-point messages to {sorted(sent)}; use the allreduce"
    return ""


def _run_local_sgd(fn: Callable, period: int, num_steps: int, comm_name: str) -> str:
    """Run on an engine: Local-SGD(``period``) on this rank's shard; return "" or what is wrong."""
    import numpy as np
    from IPython import get_ipython

    from course_lib.checks.assignments.a4 import (
        LR,
        MISTAKES,
        _builtins_used,
        _p2p,
        local_sgd_shards,
        simulate_local_sgd_numpy,
    )

    comm = get_ipython().user_ns[comm_name]
    rank, world_size = comm.rank, comm.world_size
    shards = local_sgd_shards(world_size)
    w0 = np.zeros(shards[0][0].shape[1])
    X, y = shards[rank]
    comm.stats.reset()
    got = fn(comm, w0.copy(), X.copy(), y.copy(), LR, period, num_steps)
    case = f"Local-SGD({period}), {num_steps} steps"
    if got is None:
        return f"{case}: rank {rank} returned None; return w"
    got = np.asarray(got, dtype=float)
    used = _builtins_used(comm)
    averagings = num_steps // period
    want = {"allreduce": (averagings, averagings * (len(w0) + 1) * 8)} if averagings else {}
    if used.keys() - {"allreduce"} or used.get("allreduce", (0,))[0] != averagings:
        return (
            f"{case}: rank {rank} called {used or 'no built-in collective'}; it averages "
            f"after steps {period}, {2 * period}, ...: {averagings} allreduce calls "
            "(through your weighted_average)"
        )
    if used != want:
        return (
            f"{case}: rank {rank} sent {used['allreduce'][1]} bytes in its allreduce calls, "
            f"want {want['allreduce'][1]} (w.size + 1 float64 values each)"
        )
    sent, _ = _p2p(comm)
    if sent:
        return f"{case}: rank {rank} sent point-to-point messages; average with the allreduce"
    expected = simulate_local_sgd_numpy(shards, w0, LR, period, num_steps)[rank]
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-9, atol=1e-12):
        for variant, why in MISTAKES.items():
            other = simulate_local_sgd_numpy(shards, w0, LR, period, num_steps, variant)[rank]
            if got.shape == other.shape and np.allclose(got, other, rtol=1e-9, atol=1e-12):
                return f"{case}: rank {rank}'s weights match {why}"
        return f"{case}: rank {rank}'s weights differ from the single-process reference"
    return ""


def _run_gossip(fn: Callable, world_size: int, num_steps: int, dtype: str, comm_name: str) -> str:
    """Run on an engine: ``num_steps`` directed gossip steps; return "" or what is wrong."""
    import numpy as np
    from IPython import get_ipython

    from course_lib.checks.assignments.a4 import (
        _builtins_used,
        _p2p,
        directed_distances,
        directed_gossip_matrix,
    )

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
    rank, size = comm.rank, 257
    xs = np.stack([np.random.default_rng([7, r]).normal(size=size) for r in range(world_size)])
    distances = directed_distances(world_size, num_steps)
    mixed = xs.copy()
    for s in distances:
        mixed = directed_gossip_matrix(world_size, s) @ mixed
    comm.stats.reset()
    got = fn(comm, xs[rank].astype(dtype), num_steps)
    case = f"P = {world_size}, {num_steps} steps, s = {distances}"
    if got is None:
        return f"{case}: rank {rank} returned None; return x"
    used = _builtins_used(comm)
    if used:
        return f"{case}: rank {rank} uses the built-in {sorted(used)}; write it from sendrecv"
    nbytes = size * np.dtype(dtype).itemsize
    want_sent: dict[int, int] = {}
    want_received: dict[int, int] = {}
    for s in distances:
        dst, src = (rank + s) % world_size, (rank - s) % world_size
        want_sent[dst] = want_sent.get(dst, 0) + nbytes
        want_received[src] = want_received.get(src, 0) + nbytes
    sent, received = _p2p(comm)
    if sorted(sent) != sorted(want_sent) or sorted(received) != sorted(want_received):
        return (
            f"{case}: rank {rank} sent to ranks {sorted(sent)} and received from "
            f"{sorted(received)}; on the directed ring it sends only to (r + s) mod P = "
            f"{sorted(want_sent)} and receives only from (r - s) mod P = {sorted(want_received)}"
        )
    if sent != dict(sorted(want_sent.items())) or received != dict(sorted(want_received.items())):
        return (
            f"{case} ({dtype}): rank {rank} sent {sent} bytes per rank, want {want_sent}: one "
            "vector x per step, to one partner"
        )
    got = np.asarray(got)
    tol = 1e-5 if dtype == "float32" else 1e-12
    if got.shape != (size,) or not np.allclose(got, mixed[rank], rtol=tol, atol=tol):
        return f"{case} ({dtype}): x on rank {rank} is not row {rank} of the mixed vectors"
    return ""


def _check(
    exercise: str,
    name: str,
    fn: Callable,
    cluster: Any,
    cases: list,
    runner: Callable,
    detail: str,
    comm_name: str,
    verbose: bool,
) -> Verdict:
    def body() -> str:
        assert cluster.world_size == 4, f"the check needs 4 engines, not {cluster.world_size}"
        # The function runs on the engines; under its own name there, later answers can call it.
        cluster.view.push({fn.__name__: fn}, block=True)
        for args in cases:
            try:
                reasons = cluster.run(runner, fn, *args, comm_name, timeout=60)
            except Exception as exc:
                reraise_stub(exc)
                raise
            for why in reasons:
                assert not why, why
        return detail

    return run_check(exercise, name, body, max_points=A4_POINTS[exercise], verbose=verbose)


def check_weighted_average(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A4.1: ``fn(comm, w, n)`` returns $\\sum_j n_j w_j / \\sum_j n_j$ with one allreduce."""
    cases = [(size, dtype) for size in A4_SIZES for dtype in ("float32", "float64")]
    detail = f"4 ranks, one allreduce of w.size + 1 values, {len(A4_SIZES)} sizes, float32/64"
    return _check(
        "A4.1", "weighted_average", fn, cluster, cases, _run_average, detail, comm_name, verbose
    )


def check_local_sgd(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A4.2: ``fn(comm, w, X, y, lr, period, num_steps)`` runs Local-SGD(p) like the reference."""
    periods = ", ".join(f"p = {p} for {k} steps" for p, k in LOCAL_SGD_CASES)
    detail = f"4 ranks, shards of 6, 11, 16, 21 rows, equal to one process: {periods}"
    return _check(
        "A4.2",
        "local_sgd",
        fn,
        cluster,
        list(LOCAL_SGD_CASES),
        _run_local_sgd,
        detail,
        comm_name,
        verbose,
    )


def check_directed_gossip(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A4.3: ``fn(comm, x, num_steps)`` gossips over the directed ring with rotating ``s``."""
    cases = [(p, k, dtype) for p, k in GOSSIP_CASES for dtype in ("float64", "float32")]
    detail = "P = 4 and 3, partners (r + s) and (r - s) mod P, bytes per peer, float32/64"
    return _check(
        "A4.3", "directed_gossip", fn, cluster, cases, _run_gossip, detail, comm_name, verbose
    )
