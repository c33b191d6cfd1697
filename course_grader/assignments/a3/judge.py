"""A3's references and judges, from data only: the notebook's checks and the grader share them.

:func:`judge_probe` decides one rank's single call on known gradients (what it returned, the
built-in collectives it called, the bytes it sent to and received from each peer) and names the
usual mistakes, source 000's published one above all (dividing inside the loop over the clients
and leaving the server out of the count), and, for A3.1's sharded parameter server, lecture 4's
single server (Exercise 4.1) whose traffic it is not. :func:`judge_training` decides a training run's data:
every replica equal to one process trained on the whole global batch (within float32 rounding,
:mod:`course_lib.parallel.data_parallel.reference`), the method's bytes in every step. They run
on the engines for the notebook's check cells (:mod:`course_grader.assignments.a3.checks`) and in
the grader's own process for a graded copy (:mod:`course_grader.assignments.a3.probe`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from course_grader.assignments.a3.engine import (
    CONFIG,
    A3Net,
    a3net_sizes,
    check_digits,
    probe_data,
    probe_gradients,
    run_training,
)
from course_lib.i18n import _
from course_lib.parallel.exchanges.buckets import bucket_layout as reference_bucket_layout
from course_lib.parallel.exchanges.parameter_server import source000_combine

__all__ = ["judge_probe", "judge_training", "probe", "reference_layout", "reference_weights",
           "ring_bytes_bounds", "shard_sizes", "sharded_ps_bytes", "train_and_compare",
           "train_config"]  # fmt: skip


def train_config(seed: int | None = None) -> Any:
    """The checks' training settings; a grader's ``seed`` changes the initial weights and order."""
    return CONFIG if seed is None else dataclasses.replace(CONFIG, seed=seed % 10_000)


def ring_bytes_bounds(size: int, world_size: int, itemsize: int = 4) -> tuple[int, int]:
    """Return the least and most bytes one rank sends in a ring allreduce of ``size`` values.

    In each phase rank ``r`` sends every chunk but one, $2S - c_a - c_b$ values in all; with
    chunk lengths floor(S/N) or ceil(S/N) that is about $2\\frac{N-1}{N}S$.
    """
    low = 2 * (size - -(-size // world_size))
    high = 2 * (size - size // world_size)
    return low * itemsize, high * itemsize


def shard_sizes(size: int, n: int, server: int) -> list[int]:
    """Values of the shard each rank serves: shard q of ``chunk_bounds`` is rank (server + q) % n's."""
    from course_lib.comm.buffers import chunk_bounds

    bounds = chunk_bounds(size, n)
    return [bounds[(r - server) % n][1] - bounds[(r - server) % n][0] for r in range(n)]


def sharded_ps_bytes(size: int, n: int, server: int, rank: int, itemsize: int = 4) -> dict:
    """Bytes ``rank`` sends to (and receives from) each peer in A3.1's sharded parameter server:
    its part of the peer's shard one way, the mean of its own shard the other (empty: left out)."""
    s = shard_sizes(size, n, server)
    want = {p: itemsize * (s[p] + s[rank]) for p in range(n) if p != rank}
    return {p: b for p, b in want.items() if b}


def judge_probe(
    kind: str,
    size: int,
    server: int,
    rank: int,
    grads: list[np.ndarray],
    got: Any,
    builtins: list[str],
    sent: dict[int, int],
    received: dict[int, int],
) -> str:
    """Return "" or what is wrong with one rank's call of the answer on known gradients.

    ``grads``: every rank's gradient; ``got``: what the rank holds after the call;
    ``builtins``: the built-in collectives it called (a barrier excluded); ``sent`` /
    ``received``: bytes per peer it sent to / received from.
    """
    n = len(grads)
    total = np.sum(grads, axis=0, dtype=np.float64)
    got = np.asarray(got).reshape(-1)
    if kind == "ps":
        case = _("size {size}, server rank {server}").format(size=size, server=server)
    else:
        case = _("size {size}").format(size=size)
    if builtins:
        names = _(" and ").join(f"comm.{b}" for b in builtins)
        return _(
            "{case}: rank {rank} uses the built-in {names}; write the exchange from send/recv"
        ).format(case=case, rank=rank, names=names)
    if got.shape != (size,) or not np.allclose(got, total / n, rtol=1e-6, atol=1e-6):
        known = {
            _("the sum: divide it by N = {n}").format(n=n): total,
            _("this rank's own gradient: nothing was exchanged"): grads[rank],
        }
        if kind == "ps":  # source 000's combination, each shard on its own server
            from course_lib.comm.buffers import chunk_bounds

            source000 = np.zeros(size)
            for q, (a, b) in enumerate(chunk_bounds(size, n)):
                owner = (server + q) % n
                others = [grads[r][a:b] for r in range(n) if r != owner]
                source000[a:b] = source000_combine(grads[owner][a:b], others)
            known[
                _(
                    "source 000's published combination: it divides inside the loop over the "
                    "clients and leaves the server's own gradient out; add all N, divide once"
                )
            ] = source000
            known[
                _(
                    "the sum divided by N - 1 = {m}: the server computes a gradient too, "
                    "divide by N = {n}"
                ).format(m=n - 1, n=n)
            ] = total / (n - 1)
        matches = [
            why
            for why, value in known.items()
            if got.shape == (size,) and np.allclose(got, value, rtol=1e-6)
        ]
        if matches:  # on small integers two mistakes can give equal values (a fresh seed each
            # grading: seen once in four runs for size 1): name each, never the first alone
            return _("{case}: rank {rank} holds {what}").format(
                case=case, rank=rank, what=_("; equally, ").join(matches)
            )
        return _("{case}: rank {rank} does not hold the mean of the {n} gradients").format(
            case=case, rank=rank, n=n
        )
    if kind == "ps":
        want = sharded_ps_bytes(size, n, server, rank)
        sent = {p: b for p, b in sent.items() if b}
        received = {p: b for p, b in received.items() if b}
        if sent == want and received == want:
            return ""
        star = (
            {r: size * 4 for r in range(n) if r != rank} if rank == server else {server: size * 4}
        )
        if sent == star and received == star:
            return _(
                "{case}: rank {rank} sent and received {sent} bytes per peer: that is one "
                "server for the whole vector, lecture 4's parameter server (Exercise 4.1), "
                "whose link carries (N - 1)S each way; here every rank serves one shard"
            ).format(case=case, rank=rank, sent=sent)
        q = (rank - server) % n
        return _(
            "{case}: rank {rank} sent {sent} and received {received} bytes per peer; serving "
            "shard {q} (chunk_bounds(S, N)[{q}], {values} values) "
            "it sends and receives {want}: to each peer its part of the peer's shard, and the "
            "mean of its own"
        ).format(
            case=case,
            rank=rank,
            sent=sent,
            received=received,
            q=q,
            values=shard_sizes(size, n, server)[rank],
            want=want,
        )
    right, left = (rank + 1) % n, (rank - 1) % n
    if set(sent) - {right} or set(received) - {left}:
        return _(
            "{case}: rank {rank} sent to ranks {sent} and received from "
            "{received}; on the ring it sends only to r + 1 = {right} and receives "
            "only from r - 1 = {left}"
        ).format(
            case=case,
            rank=rank,
            sent=sorted(sent),
            received=sorted(received),
            right=right,
            left=left,
        )
    low, high = ring_bytes_bounds(size, n)
    total_sent = sum(sent.values())
    if not low <= total_sent <= high:
        return _(
            "{case}: rank {rank} sent {sent} bytes; a ring allreduce sends "
            "2(N-1)/N of the buffer, {low} to {high} bytes here: one chunk of S/N per "
            "step, N - 1 steps of reduce-scatter then N - 1 of allgather"
        ).format(case=case, rank=rank, sent=total_sent, low=low, high=high)
    return ""


def judge_training(kind: str, run: dict, options: dict, seed: int | None = None) -> int:
    """Judge a training run's data (:func:`~.a3_engine.run_training`); return the steps run.

    Raises AssertionError with the reason when the replicas differ, miss one process's weights
    or a step moved other bytes than the method's.
    """
    from course_lib.parallel.data_parallel.reference import ATOL, RTOL, weights_match

    assert run["replicas_equal"], _(
        "the replicas differ by up to {diff} after training: "
        "every rank must end each step with the same averaged gradient"
    ).format(diff=f"{run['max_replica_difference']:.2e}")
    assert weights_match(run["weights"], reference_weights(seed)), _(
        "the replicas agree with each other but not with one process trained on the whole "
        "batch (beyond {atol} + {rtol} |w|): average every gradient over all N ranks"
    ).format(atol=f"{ATOL:g}", rtol=f"{RTOL:g}")
    sizes = a3net_sizes()
    bounds = [
        ring_bytes_bounds(sum(sizes[i] for i in b) + len(b), 4)  # + a presence flag each
        for b in reference_layout(sizes, options.get("bucket_bytes", 1))
    ]
    for rec in run["records"]:
        rank, sent, step = rec["rank"], rec["bytes_sent"], rec["step"]
        assert not rec["collective_bytes"], _(
            "rank {rank} used a built-in collective in step {step}; write it from send/recv"
        ).format(rank=rank, step=step)
        if kind == "ps":
            values = (run["gradient_bytes"] + run["flag_bytes"]) // 4  # flags are float32 too
            n = run["world_size"]
            want = sum(sharded_ps_bytes(values, n, options["server"], rank).values())
            ok, what = sent == want, f"{want}"
        else:  # the ring's share of every bucket
            low, high = sum(b[0] for b in bounds), sum(b[1] for b in bounds)
            what = _("2(N-1)/N of each of {n} buckets").format(n=len(bounds))
            ok = low <= sent <= high
        assert ok, _(
            "rank {rank} sent {sent} bytes in step {step} of training ({values} "
            "trainable values); the method sends {what}"
        ).format(rank=rank, sent=sent, step=step, values=sum(sizes), what=what)
    return len(run["records"]) // run["world_size"]


@functools.cache
def reference_weights(seed: int | None = None) -> dict[str, np.ndarray]:
    """The weights of one process trained on the whole global batches (the same every time)."""
    from course_lib.parallel.data_parallel.reference import train_one_process

    return train_one_process(A3Net, check_digits, train_config(seed))


def reference_layout(sizes: list[int], cap: int) -> list[list[int]]:
    """The library's bucket layout (DDP's rule) of parameters with these numbers of values."""
    return reference_bucket_layout([SimpleNamespace(numel=lambda n=n: int(n)) for n in sizes], cap)


def probe(kind: str, fn: Callable, size: int, server: int, comm_name: str) -> str:
    """Run on an engine: one call of ``fn`` on known gradients; return "" or what is wrong."""
    rank, n, got, builtins, sent, received, _rows = probe_data(kind, fn, size, server, comm_name)
    grads = probe_gradients(size, n)
    return judge_probe(kind, size, server, rank, grads, got, builtins, sent, received)


def train_and_compare(cluster: Any, kind: str, fn: Callable, **options: Any) -> int:
    """Train with the student's exchange; compare with one process; return the steps run."""
    return judge_training(kind, run_training(cluster, kind, fn, **options), options)
