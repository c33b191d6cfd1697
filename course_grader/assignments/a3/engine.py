"""The engine side of A3's checks: the answer plugged into the seam, the probe's call, the run.

The student's averaging functions plug into the kit's data-parallel seam: :func:`answer_exchange`
wraps the function in an exchange object (a
:class:`~course_lib.parallel.exchanges.base.FlatExchange` for the parameter server, a
:class:`~course_lib.parallel.exchanges.buckets.BucketedAllreduce` whose per-bucket averaging is the
student's), and :func:`run_training` hands that object to
:func:`~course_lib.parallel.data_parallel.train.train_data_parallel`; it travels to the engines
by value, with the student's function.

Everything here *collects data* and decides nothing: :func:`probe_data` calls the function once
on every rank with known integer-valued gradients and reads the communicator's counters (the
built-in collectives, bytes per peer); :func:`run_training` trains 2 epochs (10 steps) on 4
engines, on a network with a frozen bias, tied weights and 599 trainable values (a prime), and
returns the weights, the replica check and each step's bytes. The judges live in
:mod:`course_grader.assignments.a3.judge`, the verdicts in
:mod:`course_grader.assignments.a3.checks`. A graded kernel sees this module and not those: the
grader runs :func:`kernel_case` there and judges its data in its own process
(:mod:`course_grader.assignments.a3.probe`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from course_lib.i18n import _
from course_lib.training.loop import TrainConfig

__all__ = ["BUCKET_METHOD", "COMM_TIMEOUT", "CONFIG", "PS_METHOD", "A3Net", "a3net_sizes",
           "answer_exchange", "check_digits", "connect", "fail_fast_on_stub", "kernel_case",
           "prepare_engines", "probe_data", "probe_gradients", "raise_run_failure",
           "run_training"]  # fmt: skip

PS_METHOD, BUCKET_METHOD = "a3_parameter_server", "a3_bucketed"
CONFIG = TrainConfig(num_epochs=2, batch_size=48, lr=0.5, momentum=0.5, seed=3)
COMM_TIMEOUT = 20.0


class A3Net(nn.Module):
    """A frozen bias, one weight tied between two layers, 599 trainable values (a prime)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(64, 7)
        self.inp.bias.requires_grad_(False)  # frozen: neither sent nor changed
        self.mid_a, self.mid_b = nn.Linear(7, 7), nn.Linear(7, 7)
        self.mid_b.weight = self.mid_a.weight  # tied: one parameter, two layers
        self.out = nn.Linear(7, 11)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x.flatten(1)))
        return self.out(torch.relu(self.mid_b(torch.relu(self.mid_a(h)))))


def check_digits() -> TensorDataset:
    """The first 240 training digits: 5 global batches of 48 per epoch."""
    from course_lib.data.digits import load_digits

    X, y = load_digits().tensors
    return TensorDataset(X[:240], y[:240])


# ---- plugging the answers into the seam ------------------------------------------------------
def answer_exchange(kind: str, fn: Callable, **options: Any) -> Any:
    """Return the exchange ``PS_METHOD`` (kind "ps") or ``BUCKET_METHOD`` that averages with ``fn``.

    ``options`` are its constructor's (``server``; ``bucket_bytes``). The instance travels to the
    engines by value, with ``fn``: no registration anywhere.
    """
    from course_lib.parallel.exchanges.base import FlatExchange
    from course_lib.parallel.exchanges.buckets import BucketedAllreduce

    def into(flat: np.ndarray, out: Any) -> None:  # an answer may return a new array
        if out is not None and out is not flat:
            np.copyto(flat, np.asarray(out, dtype=flat.dtype).reshape(flat.shape))

    class StudentParameterServer(FlatExchange):
        name = PS_METHOD

        def __init__(self, server: int = 0) -> None:
            self.server = server

        def average(self, comm: Any, flat: np.ndarray) -> None:
            into(flat, fn(comm, flat, self.server))

    class StudentBucketed(BucketedAllreduce):
        name = BUCKET_METHOD

        def __init__(self, bucket_bytes: int = 1 << 20, layout: Any = None) -> None:
            super().__init__(bucket_bytes, algorithm="ring")  # the answer is a ring: no timing
            self.fixed_layout = layout  # of the path to choose by; the grader's buckets

        def layout(self, params: list) -> list[list[int]]:
            # The grader lays the buckets out (the kit's bucket_layout is A3.2's answer, cut
            # from the kit this kernel sees); without a layout, the kit's own rule
            if self.fixed_layout is None:
                return super().layout(params)
            return [[int(i) for i in bucket] for bucket in self.fixed_layout]

        def _allreduce(self, flat: torch.Tensor) -> None:  # runs on the communication thread
            buf = flat.numpy()
            into(buf, fn(self.comm, buf))

    return (StudentParameterServer if kind == "ps" else StudentBucketed)(**options)


def _builtins(comm: Any) -> list[str]:
    return sorted(name for name in comm.stats.collectives if name != "barrier")


def _peers(comm: Any) -> tuple[dict[int, int], dict[int, int]]:
    peers = sorted(comm.stats.peers.items())
    return (
        {p: s.bytes_sent for p, s in peers if s.messages_sent},
        {p: s.bytes_received for p, s in peers if s.messages_received},
    )


# ---- the probe's call (run on every engine) ---------------------------------------------------
def probe_gradients(size: int, world_size: int, seed: int | None = None) -> list[np.ndarray]:
    """Every rank's known gradient: small integers as float32 (every summation order is exact)."""
    key = [size] if seed is None else [seed, size]
    return [
        np.random.default_rng([*key, r]).integers(-8, 9, size).astype(np.float32)
        for r in range(world_size)
    ]


def probe_data(
    kind: str, fn: Callable, size: int, server: int, comm_name: str, seed: int | None = None
) -> tuple:
    """Run on an engine: one call of ``fn`` on known gradients; return what it did, as data.

    Returns (rank, world size, what the rank holds after the call, the built-in collectives it
    called, {peer: bytes sent}, {peer: bytes received}, and all its counts as
    ``comm.stats.as_rows()``: what the grader holds against the bytes on the wire).
    """
    from IPython import get_ipython

    comm = get_ipython().user_ns[comm_name]
    rank, n = comm.rank, comm.world_size
    flat = probe_gradients(size, n, seed)[rank].copy()
    comm.stats.reset()
    out = fn(comm, flat, server) if kind == "ps" else fn(comm, flat)
    got = flat if out is None else np.asarray(out).reshape(-1)
    sent, received = _peers(comm)
    return rank, n, got, _builtins(comm), sent, received, comm.stats.as_rows()


def raise_run_failure(exc: BaseException) -> None:
    """Turn a failed run on the engines into the verdict's reason (a stub's: not implemented)."""
    text = str(exc).replace("data-parallel run failed: ", "")
    if "NotImplementedError: " in text:
        raise NotImplementedError(text.split("NotImplementedError: ", 1)[1]) from None
    raise AssertionError(text) from None


# ---- the kernel's side: engines, the training run ---------------------------------------------
def fail_fast_on_stub(fn: Callable, *args: Any) -> None:
    """Raise a stub's NotImplementedError here, before any engine is busy; else do nothing."""
    try:
        fn(None, np.zeros(3, np.float32), *args)  # no communicator: a real answer stops at once
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - a real answer uses comm: the engines will judge it
        pass


def connect(cluster: Any) -> list[int]:
    """Make sure the first 4 engines have the checks' communicator; return their ids."""
    from course_lib.parallel.data_parallel.engines import ensure_communicators, select_engines

    assert cluster.world_size >= 4, _("A3 needs 4 engines, not {n}").format(n=cluster.world_size)
    ids = select_engines(cluster, 4)
    ensure_communicators(cluster, ids, "gloo", None, COMM_TIMEOUT)  # the runs' own dp_comm
    return ids


def prepare_engines(cluster: Any) -> None:
    """Give 4 engines the checks' communicator and the training code (slow once: a set-up cell)."""
    ids = connect(cluster)
    # Load what a run needs once, here, so that the first check cell is not the slow one.
    warm_up = (
        "import course_lib.parallel.exchanges.registry, course_lib.parallel.data_parallel.replica"
    )
    cluster.client[ids].execute(
        f"{warm_up}; from course_grader.assignments.a3.engine import check_digits; check_digits()",
        block=True,
    )


def run_training(
    cluster: Any, kind: str, fn: Callable, config: TrainConfig = CONFIG, **options: Any
) -> dict[str, Any]:
    """Train with the student's exchange on 4 engines; return the run's data to judge.

    The data: the replica check, rank 0's weights by name, the gradient's and flags' bytes,
    per step and rank the bytes sent and the bytes of built-in collectives, and each rank's
    counts of the set-up and of the steps (``DataParallelResult.counters``).
    """
    from course_lib.parallel.data_parallel.train import DataParallelError, train_data_parallel

    method = answer_exchange(kind, fn, **options)  # the seam: an exchange object
    try:
        result = train_data_parallel(
            cluster,
            model=A3Net,
            dataset=check_digits,
            config=config,
            method=method,
            world_size=4,
            comm_timeout=COMM_TIMEOUT,
            timeout=240,
        )
    except DataParallelError as exc:
        raise_run_failure(exc)
    keys = ("rank", "step", "bytes_sent", "collective_bytes")
    return {
        "world_size": result.world_size,
        "replicas_equal": bool(result.replicas_equal),
        "max_replica_difference": float(result.max_replica_difference),
        "gradient_bytes": int(result.gradient_bytes),
        "flag_bytes": int(result.flag_bytes),
        "weights": dict(result.weights),
        "records": [{k: rec[k] for k in keys} for rec in result.records],
        "counters": result.counters,
    }


def kernel_case(cluster: Any, kind: str, fn: Callable, case: dict) -> Any:
    """Run one of the grader's cases in a graded kernel; return its data, never a verdict.

    ``case["run"]`` is "probe" (every rank's :func:`probe_data`, in rank order) or "train"
    (:func:`run_training` with the grader's seed, as nested lists: the kernel prints data).
    """
    from course_lib.parallel.data_parallel.engines import (
        COMM_NAME,
        DataParallelError,
        run_on_engines,
    )

    fail_fast_on_stub(fn, *([0] if kind == "ps" else []))
    ids = connect(cluster)
    if case["run"] == "probe":
        args = (kind, fn, case["size"], case["server"], COMM_NAME, case["seed"])
        try:  # a hang is recovered and a dead engine named, never a stuck check cell
            ranks = run_on_engines(cluster, ids, probe_data, args, COMM_TIMEOUT + 40)
        except DataParallelError as exc:
            raise_run_failure(exc)
        return [
            (r, n, got, b, sorted(s.items()), sorted(rc.items()), counts)
            for r, n, got, b, s, rc, counts in ranks
        ]
    options = {k: case[k] for k in ("server", "bucket_bytes", "layout") if k in case}
    config = dataclasses.replace(CONFIG, seed=case["train_seed"])
    run = run_training(cluster, kind, fn, config, **options)
    return (
        run["world_size"],
        int(run["replicas_equal"]),
        run["max_replica_difference"],
        run["gradient_bytes"],
        run["flag_bytes"],
        sorted(run["weights"].items()),
        [
            [rec[k] for k in ("rank", "step", "bytes_sent", "collective_bytes")]
            for rec in run["records"]
        ],
        run["counters"],
    )


def a3net_sizes() -> list[int]:
    """Return the number of values of each trainable parameter of :class:`A3Net`, in order."""
    return [p.numel() for p in A3Net().parameters() if p.requires_grad]
