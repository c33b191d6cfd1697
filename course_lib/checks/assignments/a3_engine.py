"""The engine side of A3's checks: the answer plugged into the seam, the probe, the training run.

The student's averaging functions plug into the kit's data-parallel seam: :func:`answer_exchange`
wraps the function in an exchange object (a
:class:`~course_lib.parallel.exchanges.base.FlatExchange` for the parameter server, a
:class:`~course_lib.parallel.exchanges.buckets.BucketedAllreduce` whose per-bucket averaging is the
student's), and :func:`train_and_compare` hands that object to
:func:`~course_lib.parallel.data_parallel.train.train_data_parallel`; it travels to the engines
by value, with the student's function.

The **probe** calls the function once on every rank with known integer-valued gradients and
reads the communicator's counters: no built-in collective (the exercise is to write the
exchange), who talked to whom, and how many bytes. It names the usual mistakes, source 000's
published one above all (dividing inside the loop over the clients and leaving the server out of
the count). The **training run** of 2 epochs (10 steps) on 4 engines, on a network with a frozen
bias, tied weights and 599 trainable values (a prime), must leave every replica equal to one
process trained on the whole global batch (within float32 rounding,
:mod:`course_lib.parallel.data_parallel.reference`) and move the method's bytes in every step. The verdicts
around them live in :mod:`course_lib.checks.assignments.a3`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from course_lib.parallel.exchanges.buckets import bucket_layout as reference_bucket_layout
from course_lib.parallel.exchanges.parameter_server import source000_combine
from course_lib.training.loop import TrainConfig

__all__ = ["BUCKET_METHOD", "COMM_TIMEOUT", "CONFIG", "PS_METHOD", "A3Net", "a3net_sizes",
           "check_digits", "probe", "raise_run_failure", "reference_layout", "reference_weights",
           "answer_exchange", "ring_bytes_bounds", "train_and_compare"]  # fmt: skip

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


def ring_bytes_bounds(size: int, world_size: int, itemsize: int = 4) -> tuple[int, int]:
    """Return the least and most bytes one rank sends in a ring allreduce of ``size`` values.

    In each phase rank ``r`` sends every chunk but one, $2S - c_a - c_b$ values in all; with
    chunk lengths floor(S/N) or ceil(S/N) that is about $2\\frac{N-1}{N}S$.
    """
    low = 2 * (size - -(-size // world_size))
    high = 2 * (size - size // world_size)
    return low * itemsize, high * itemsize


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

        def __init__(self, bucket_bytes: int = 1 << 20) -> None:  # the answer is a ring: no
            super().__init__(bucket_bytes, algorithm="ring")  # timing of the path to choose by

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


# ---- the probes (run on every engine) ---------------------------------------------------------
def probe(kind: str, fn: Callable, size: int, server: int, comm_name: str) -> str:
    """Run on an engine: one call of ``fn`` on known gradients; return "" or what is wrong."""
    from IPython import get_ipython

    comm = get_ipython().user_ns[comm_name]
    rank, n = comm.rank, comm.world_size
    grads = [
        np.random.default_rng([size, r]).integers(-8, 9, size).astype(np.float32) for r in range(n)
    ]
    total = np.sum(grads, axis=0, dtype=np.float64)
    flat = grads[rank].copy()
    comm.stats.reset()
    out = fn(comm, flat, server) if kind == "ps" else fn(comm, flat)
    got = flat if out is None else np.asarray(out).reshape(-1)
    case = f"size {size}" + (f", server rank {server}" if kind == "ps" else "")
    if _builtins(comm):
        names = " and ".join(f"comm.{b}" for b in _builtins(comm))
        return f"{case}: rank {rank} uses the built-in {names}; write the exchange from send/recv"
    if got.shape != (size,) or not np.allclose(got, total / n, rtol=1e-6, atol=1e-6):
        known = {
            f"the sum: divide it by N = {n}": total,
            "this rank's own gradient: nothing was exchanged": grads[rank],
        }
        if kind == "ps":
            others = [grads[r] for r in range(n) if r != server]
            known[
                "source 000's published combination: it divides inside the loop over the "
                "clients and leaves the server's own gradient out; add all N, divide once"
            ] = source000_combine(grads[server], others)
            known[
                f"the sum divided by N - 1 = {n - 1}: the server computes a gradient too, "
                f"divide by N = {n}"
            ] = total / (n - 1)
        for why, value in known.items():
            if got.shape == (size,) and np.allclose(got, value, rtol=1e-6):
                return f"{case}: rank {rank} holds {why}"
        return f"{case}: rank {rank} does not hold the mean of the {n} gradients"
    sent, received = _peers(comm)
    if kind == "ps":
        nbytes = size * 4
        want = {r: nbytes for r in range(n) if r != rank} if rank == server else {server: nbytes}
        role = "the server" if rank == server else "a worker"
        if sent != want or received != want:
            return (
                f"{case}: rank {rank} ({role}) sent {sent} and received {received} bytes "
                f"per peer; {role} sends and receives {want}: workers talk only to the "
                "server, one gradient each way"
            )
        return ""
    right, left = (rank + 1) % n, (rank - 1) % n
    if set(sent) - {right} or set(received) - {left}:
        return (
            f"{case}: rank {rank} sent to ranks {sorted(sent)} and received from "
            f"{sorted(received)}; on the ring it sends only to r + 1 = {right} and receives "
            f"only from r - 1 = {left}"
        )
    low, high = ring_bytes_bounds(size, n)
    total_sent = sum(sent.values())
    if not low <= total_sent <= high:
        return (
            f"{case}: rank {rank} sent {total_sent} bytes; a ring allreduce sends "
            f"2(N-1)/N of the buffer, {low} to {high} bytes here: one chunk of S/N per "
            "step, N - 1 steps of reduce-scatter then N - 1 of allgather"
        )
    return ""


def raise_run_failure(exc: BaseException) -> None:
    """Turn a failed run on the engines into the verdict's reason (a stub's: not implemented)."""
    text = str(exc).replace("data-parallel run failed: ", "")
    if "NotImplementedError: " in text:
        raise NotImplementedError(text.split("NotImplementedError: ", 1)[1]) from None
    raise AssertionError(text) from None


def train_and_compare(cluster: Any, kind: str, fn: Callable, **options: Any) -> int:
    """Train with the student's exchange; compare with one process; return the steps run."""
    from course_lib.parallel.data_parallel.reference import ATOL, RTOL, weights_match
    from course_lib.parallel.data_parallel.train import DataParallelError, train_data_parallel

    method = answer_exchange(kind, fn, **options)  # the seam: an exchange object
    try:
        result = train_data_parallel(
            cluster,
            model=A3Net,
            dataset=check_digits,
            config=CONFIG,
            method=method,
            world_size=4,
            comm_timeout=COMM_TIMEOUT,
            timeout=240,
        )
    except DataParallelError as exc:
        raise_run_failure(exc)
    assert result.replicas_equal, (
        f"the replicas differ by up to {result.max_replica_difference:.2e} after training: "
        "every rank must end each step with the same averaged gradient"
    )
    assert weights_match(result.weights, reference_weights()), (
        "the replicas agree with each other but not with one process trained on the whole "
        f"batch (beyond {ATOL:g} + {RTOL:g} |w|): average every gradient over all N ranks"
    )
    sizes = a3net_sizes()
    bounds = [
        ring_bytes_bounds(sum(sizes[i] for i in b) + len(b), 4)  # + a presence flag each
        for b in reference_layout(sizes, options.get("bucket_bytes", 1))
    ]
    for rec in result.records:
        rank, sent, step = rec["rank"], rec["bytes_sent"], rec["step"]
        assert not rec["collective_bytes"], (
            f"rank {rank} used a built-in collective in step {step}; write it from send/recv"
        )
        if kind == "ps":
            want = (result.gradient_bytes + result.flag_bytes) * (
                3 if rank == options["server"] else 1
            )
            ok, what = sent == want, f"{want}"
        else:  # the ring's share of every bucket
            low, high = sum(b[0] for b in bounds), sum(b[1] for b in bounds)
            ok, what = low <= sent <= high, f"2(N-1)/N of each of {len(bounds)} buckets"
        assert ok, (
            f"rank {rank} sent {sent} bytes in step {step} of training ({sum(sizes)} "
            f"trainable values); the method sends {what}"
        )
    return len(result.records) // result.world_size


@functools.cache
def reference_weights() -> dict[str, np.ndarray]:
    """The weights of one process trained on the whole global batches (the same every time)."""
    from course_lib.parallel.data_parallel.reference import train_one_process

    return train_one_process(A3Net, check_digits, CONFIG)


def a3net_sizes() -> list[int]:
    """Return the number of values of each trainable parameter of :class:`A3Net`, in order."""
    return [p.numel() for p in A3Net().parameters() if p.requires_grad]


def reference_layout(sizes: list[int], cap: int) -> list[list[int]]:
    """The library's bucket layout (DDP's rule) of parameters with these numbers of values."""
    return reference_bucket_layout([SimpleNamespace(numel=lambda n=n: int(n)) for n in sizes], cap)
