"""A4's references and judges, from data only: the notebook's checks and the grader share them.

Each ``judge_*`` takes what one rank returned and what its communicator counted (built-in
collectives ``{name: (calls, bytes)}``, point-to-point bytes per peer) and returns "" or what is
wrong, with the same words whether it runs on an engine (the check cells of
:mod:`course_grader.assignments.a4.checks`) or in the grader's own process
(:mod:`course_grader.assignments.a4.probe`). The inputs come from a seed: ``seed=None`` gives the
notebook's fixed inputs, an integer the grader's fresh ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_lib.i18n import N_, _

__all__ = [
    "A4_SIZES",
    "GOSSIP_CASES",
    "LOCAL_SGD_CASES",
    "LR",
    "MISTAKES",
    "average_inputs",
    "directed_distances",
    "directed_gossip_matrix",
    "gossip_inputs",
    "judge_average",
    "judge_gossip",
    "judge_local_sgd",
    "local_sgd_shards",
    "simulate_local_sgd_numpy",
]

A4_SIZES = (1, 10, 1001)
LOCAL_SGD_CASES = ((1, 4), (3, 10), (4, 8))  # (period, num_steps): ends between averagings too
GOSSIP_CASES = ((4, 5), (3, 4))  # (world size, num_steps); 3 ranks: a subgroup, odd P
GOSSIP_SIZE = 257
LR = 0.1
FEATURES = 5
# Local-SGD variants a wrong answer is compared with, and what to tell the student.
MISTAKES = {
    "mean": N_("the plain mean of the weights: weight each rank by its shard size n_i"),
    "gradients": N_("averaging the gradients every p steps: Local-SGD averages the weights"),
    "before": N_(
        "averaging before the step (source 001's Algorithm 1 as written): average "
        "after every p-th step"
    ),
    "before_fresh": N_("averaging before the step: average after every p-th step"),
}


def directed_distances(world_size: int, num_steps: int) -> list[int]:
    """Return the distance ``s`` of each step: 1, 2, ..., floor(P / 2), then 1 again (source 001)."""
    out, s = [], 1
    for _step in range(num_steps):
        out.append(s)
        s = 1 if s + 1 > world_size / 2 else s + 1
    return out


def directed_gossip_matrix(world_size: int, s: int) -> np.ndarray:
    """Return $(I + P_s) / 2$: row ``i`` averages rank ``i`` with rank ``(i - s) mod P``."""
    w = np.eye(world_size) / 2
    for i in range(world_size):
        w[i, (i - s) % world_size] += 0.5
    return w


def average_inputs(
    size: int, dtype: str, world_size: int, seed: int | None = None
) -> tuple[list[np.ndarray], list[int]]:
    """Return every rank's ``w`` and its unequal count ``n`` (the plain mean is wrong)."""
    key = [size] if seed is None else [seed, size]
    ws = [
        np.random.default_rng([*key, r]).normal(size=size).astype(dtype) for r in range(world_size)
    ]
    return ws, [3 + 7 * r for r in range(world_size)]


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


def gossip_inputs(world_size: int, seed: int | None = None) -> np.ndarray:
    """Return the stacked vectors ``x`` of the ranks (one row each) that gossip mixes."""
    key = [7] if seed is None else [seed, 7]
    return np.stack(
        [np.random.default_rng([*key, r]).normal(size=GOSSIP_SIZE) for r in range(world_size)]
    )


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
    n = np.array([len(y) for _X, y in shards], dtype=float)
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


def judge_average(
    size: int,
    dtype: str,
    rank: int,
    ws: list[np.ndarray],
    counts: list[int],
    got: Any,
    used: dict[str, tuple[int, int]],
    sent: dict[int, int],
    received: dict[int, int],
) -> str:
    """A4.1 on one rank: the weighted mean, by one allreduce of ``w.size + 1`` values."""
    expected = sum(c * w.astype(float) for c, w in zip(counts, ws, strict=True)) / sum(counts)
    if got is None:
        return _("rank {rank} returned None; return w").format(rank=rank)
    got = np.asarray(got)
    if got.shape != (size,) or got.dtype != np.dtype(dtype):
        return _("size {size}: rank {rank} returned {got}, w was {want}").format(
            size=size, rank=rank, got=f"{got.dtype}{got.shape}", want=f"{dtype}({size},)"
        )
    tol = 1e-5 if dtype == "float32" else 1e-12
    if not np.allclose(got, expected, rtol=tol, atol=tol):
        plain = sum(w.astype(float) for w in ws) / len(ws)
        hint = (
            _("that is the plain mean; weight each rank's w by its n")
            if np.allclose(got, plain, rtol=tol, atol=tol)
            else _("want sum_j n_j w_j / sum_j n_j")
        )
        return _("size {size} ({dtype}): the result on rank {rank} is wrong ({hint})").format(
            size=size, dtype=dtype, rank=rank, hint=hint
        )
    want = {"allreduce": (1, (size + 1) * np.dtype(dtype).itemsize)}
    if used != want:
        return _(
            "size {size} ({dtype}): rank {rank} called {used}; "
            "average with one comm.allreduce of w.size + 1 = {values} values in w's dtype "
            "(n packed beside n * w): each call costs a latency"
        ).format(
            size=size,
            dtype=dtype,
            rank=rank,
            used=used or _("no built-in collective"),
            values=size + 1,
        )
    if sent or received:
        return _("rank {rank} sent point-to-point messages to {peers}; use the allreduce").format(
            rank=rank, peers=sorted(sent)
        )
    return ""


def judge_local_sgd(
    period: int,
    num_steps: int,
    rank: int,
    shards: list[tuple[np.ndarray, np.ndarray]],
    got: Any,
    used: dict[str, tuple[int, int]],
    sent: dict[int, int],
) -> str:
    """A4.2 on one rank: one allreduce per averaging, weights equal to one process's run."""
    case = _("Local-SGD({period}), {steps} steps").format(period=period, steps=num_steps)
    if got is None:
        return _("{case}: rank {rank} returned None; return w").format(case=case, rank=rank)
    got = np.asarray(got, dtype=float)
    w0 = np.zeros(shards[0][0].shape[1])
    averagings = num_steps // period
    want = {"allreduce": (averagings, averagings * (len(w0) + 1) * 8)} if averagings else {}
    if used.keys() - {"allreduce"} or used.get("allreduce", (0,))[0] != averagings:
        return _(
            "{case}: rank {rank} called {used}; it averages "
            "after steps {period}, {period2}, ...: {averagings} allreduce calls "
            "(through your weighted_average)"
        ).format(
            case=case,
            rank=rank,
            used=used or _("no built-in collective"),
            period=period,
            period2=2 * period,
            averagings=averagings,
        )
    if used != want:
        return _(
            "{case}: rank {rank} sent {got} bytes in its allreduce calls, "
            "want {want} (w.size + 1 float64 values each)"
        ).format(case=case, rank=rank, got=used["allreduce"][1], want=want["allreduce"][1])
    if sent:
        return _(
            "{case}: rank {rank} sent point-to-point messages; average with the allreduce"
        ).format(case=case, rank=rank)
    expected = simulate_local_sgd_numpy(shards, w0, LR, period, num_steps)[rank]
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-9, atol=1e-12):
        for variant, why in MISTAKES.items():
            other = simulate_local_sgd_numpy(shards, w0, LR, period, num_steps, variant)[rank]
            if got.shape == other.shape and np.allclose(got, other, rtol=1e-9, atol=1e-12):
                return _("{case}: rank {rank}'s weights match {why}").format(
                    case=case, rank=rank, why=_(why)
                )
        return _("{case}: rank {rank}'s weights differ from the single-process reference").format(
            case=case, rank=rank
        )
    return ""


def judge_gossip(
    num_steps: int,
    dtype: str,
    rank: int,
    xs: np.ndarray,
    got: Any,
    used: dict[str, tuple[int, int]],
    sent: dict[int, int],
    received: dict[int, int],
) -> str:
    """A4.3 on one rank: partners ``(r + s)`` and ``(r - s) mod P``, one vector a step, the mix."""
    world_size, size = xs.shape
    distances = directed_distances(world_size, num_steps)
    mixed = xs.copy()
    for s in distances:
        mixed = directed_gossip_matrix(world_size, s) @ mixed
    case = _("P = {p}, {steps} steps, s = {distances}").format(
        p=world_size, steps=num_steps, distances=distances
    )
    if got is None:
        return _("{case}: rank {rank} returned None; return x").format(case=case, rank=rank)
    if used:
        return _("{case}: rank {rank} uses the built-in {names}; write it from sendrecv").format(
            case=case, rank=rank, names=sorted(used)
        )
    nbytes = size * np.dtype(dtype).itemsize
    want_sent: dict[int, int] = {}
    want_received: dict[int, int] = {}
    for s in distances:
        dst, src = (rank + s) % world_size, (rank - s) % world_size
        want_sent[dst] = want_sent.get(dst, 0) + nbytes
        want_received[src] = want_received.get(src, 0) + nbytes
    if sorted(sent) != sorted(want_sent) or sorted(received) != sorted(want_received):
        return _(
            "{case}: rank {rank} sent to ranks {sent} and received from "
            "{received}; on the directed ring it sends only to (r + s) mod P = "
            "{want_sent} and receives only from (r - s) mod P = {want_received}"
        ).format(
            case=case,
            rank=rank,
            sent=sorted(sent),
            received=sorted(received),
            want_sent=sorted(want_sent),
            want_received=sorted(want_received),
        )
    if sent != dict(sorted(want_sent.items())) or received != dict(sorted(want_received.items())):
        return _(
            "{case} ({dtype}): rank {rank} sent {sent} bytes per rank, want {want}: one "
            "vector x per step, to one partner"
        ).format(case=case, dtype=dtype, rank=rank, sent=sent, want=want_sent)
    got = np.asarray(got)
    tol = 1e-5 if dtype == "float32" else 1e-12
    if got.shape != (size,) or not np.allclose(got, mixed[rank], rtol=tol, atol=tol):
        return _(
            "{case} ({dtype}): x on rank {rank} is not row {rank} of the mixed vectors"
        ).format(case=case, dtype=dtype, rank=rank)
    return ""
