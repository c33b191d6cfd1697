"""Lecture 10: Layer (pipeline) parallelism: a sequential model cut into stages, one stage per rank.

Stage s runs layers ``bounds[s]`` of an ``nn.Sequential``; in each step the batch is cut into m
micro-batches, activations go forward to stage s+1 and activation gradients come back to stage
s-1 through the Communicator (source 001's layer parallelism). The order of forwards and
backwards on each stage is a schedule from :mod:`course_lib.parallel.pipeline_parallel.schedule`
(naive, GPipe, 1F1B) or a schedule object such as ``Interleaved1F1B``, whose ranks each hold v
model chunks (chunk c of rank s is stage $cp + s$ of $pv$, and the last rank hands chunk c's
output round to rank 0's chunk c + 1); every stage accumulates its parameters' gradients over
the m micro-batches, so one step equals one full-batch step of the whole model in one process.

Messages: each activation / gradient is sent with ``isend`` and waited for at the end of the
step, so two neighbours that both send (one forward, one backward, as in 1F1B) never deadlock.
The first activation of a step across each boundary is preceded by its shape (8 int64, 64
bytes); later micro-batches have the same shape, and a gradient has its activation's shape.
Activations are float32.

Kept whole: one pipeline step and the stage cuts it runs on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from course_lib.comm.buffers import chunk_bounds
from course_lib.comm.communicator import Communicator, Handle, wait_all
from course_lib.parallel.pipeline_parallel.schedule import (
    SCHEDULES,
    Interval,
    ScheduleFn,
    Timeline,
    action_chunk,
    num_chunks,
    schedule,
)

__all__ = [
    "PipelineSettings",
    "PipelineStageError",
    "balance_stages",
    "even_stages",
    "measure_layer_costs",
    "pipeline_step",
    "split_stages",
]

# The forward of micro-batch i out of chunk c on tag 100 + 2(cm + i), its backward on 101 + 2(cm + i)
# (c the sending chunk); chunk c's shape header on tag 90 + c.
_SHAPE_TAG, _TAG0, _MAX_CHUNKS = 90, 100, 10


class PipelineStageError(RuntimeError):
    """A stage failed; the message names the stage, the pass and the micro-batch."""

    def __init__(self, message: str, stage: int, kind: str, microbatch: int) -> None:
        super().__init__(message)
        self.stage, self.kind, self.microbatch = stage, kind, microbatch


@dataclass(frozen=True)
class PipelineSettings:
    """How one step is pipelined: the schedule and how many micro-batches cut the batch.

    ``schedule`` is a name of :data:`SCHEDULES` or a schedule object (``Interleaved1F1B(v)``).
    """

    schedule: str | ScheduleFn = "1f1b"
    num_microbatches: int = 4
    batch_size: int = 32

    def __post_init__(self) -> None:
        if not callable(self.schedule) and self.schedule not in SCHEDULES:
            raise ValueError(
                f"unknown schedule {self.schedule!r}: choose one of {list(SCHEDULES)} or a "
                "schedule object such as Interleaved1F1B(2)"
            )
        m, n = self.num_microbatches, self.batch_size
        if m < 1 or n < 1 or n % m:
            divisors = [d for d in range(1, n + 1) if n % d == 0] if n >= 1 else []
            raise ValueError(
                f"{m} micro-batches do not divide a batch of {n}: choose num_microbatches among "
                f"the divisors of the batch size {divisors}, or change the batch size"
            )
        v = self.num_chunks
        if v > _MAX_CHUNKS:
            raise ValueError(f"{v} model chunks exceed the {_MAX_CHUNKS} that message tags allow")
        if m * v > 4000:
            raise ValueError(
                f"{m} micro-batches x {v} chunks exceed the 4000 that message tags allow"
            )

    @property
    def microbatch_size(self) -> int:
        """Return the samples per micro-batch."""
        return self.batch_size // self.num_microbatches

    @property
    def num_chunks(self) -> int:
        """Return the model chunks each rank holds (1 unless the schedule interleaves)."""
        return num_chunks(self.schedule)

    @property
    def label(self) -> str:
        """Return the schedule's name for messages."""
        return getattr(self.schedule, "name", str(self.schedule))


def _check_stages(num_layers: int, num_stages: int) -> None:
    if num_stages < 1:
        raise ValueError(f"need at least one stage, got {num_stages}")
    if num_stages > num_layers:
        raise ValueError(
            f"cannot cut a model of {num_layers} layers into {num_stages} stages: every stage "
            f"needs a layer. Use at most {num_layers} engines (stages), or a deeper model."
        )


def even_stages(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Return ``(start, stop)`` layer ranges of nearly equal length, the first ones longer."""
    _check_stages(num_layers, num_stages)
    return chunk_bounds(num_layers, num_stages)


def balance_stages(costs: Sequence[float], num_stages: int) -> list[tuple[int, int]]:
    """Return contiguous layer ranges that minimise the most expensive stage's total cost.

    A pipeline runs at the pace of its slowest stage, so this is the min-max partition of the
    per-layer ``costs`` (dynamic programming over split points, $O(L^2 p)$).
    """
    n = len(costs)
    _check_stages(n, num_stages)
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    inf = float("inf")
    # best[k][j]: the smallest possible max stage cost putting layers 0..j-1 on k stages
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                worst = max(best[k - 1][i], prefix[j] - prefix[i])
                if worst < best[k][j]:
                    best[k][j], cut[k][j] = worst, i
    bounds, j = [], n
    for k in range(num_stages, 0, -1):
        bounds.append((cut[k][j], j))
        j = cut[k][j]
    return bounds[::-1]


def measure_layer_costs(model: nn.Sequential, X: torch.Tensor, repeats: int = 5) -> list[float]:
    """Return each layer's fastest seconds (of ``repeats``) for a forward and a backward pass.

    Runs on one thread and keeps the minimum: on a shared machine other processes only ever add
    time, and a thread team waiting for a descheduled member can stall for milliseconds.
    """
    times = np.zeros((repeats + 1, len(model)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for r in range(repeats + 1):  # the first round warms up (allocations, lazy init)
            x = X
            for j, layer in enumerate(model):
                x = x.detach().requires_grad_()
                t0 = time.perf_counter()
                y = layer(x)
                y.backward(torch.ones_like(y))
                times[r, j] = time.perf_counter() - t0
                x = y
    finally:
        torch.set_num_threads(threads)
    return times[1:].min(axis=0).tolist()


def split_stages(model: nn.Sequential, bounds: Sequence[tuple[int, int]]) -> list[nn.Sequential]:
    """Return one ``nn.Sequential`` per stage holding (sharing) layers ``bounds[s]`` of ``model``."""
    _check_stages(len(model), len(bounds))
    stop = 0
    for a, b in bounds:
        if a != stop or b <= a:
            break
        stop = b
    if stop != len(model):
        raise ValueError(
            f"bounds {list(bounds)} must cover layers 0..{len(model)} in order, each stage "
            "non-empty; get them from even_stages(...) or balance_stages(...)"
        )
    # A plain Sequential per stage: slicing a Sequential subclass (the kit's LeNet, SmallCNN)
    # would call the subclass's own constructor with the layers, which it does not take.
    layers = list(model)
    return [nn.Sequential(*layers[a:b]) for a, b in bounds]


def pipeline_step(
    stage: nn.Module | Sequence[nn.Module],
    comm: Communicator,
    settings: PipelineSettings,
    X: torch.Tensor | None = None,
    y: torch.Tensor | None = None,
    loss_fn: Callable = nn.functional.cross_entropy,
) -> tuple[float | None, Timeline]:
    """Run one pipelined forward and backward of a batch; every rank of ``comm`` calls it.

    Rank s holds ``stage`` s of ``comm.world_size`` (with v chunks, a list of v modules: chunk
    c is stage $cp + s$ of the model cut in $pv$, e.g. ``split_stages(model, even_stages(L,
    p * v))[s::p]``). Rank 0 passes the batch ``X``, the last rank the targets ``y``. Gradients
    are accumulated into the stage's parameters (zero them before, step the optimiser after).
    Returns the batch's mean loss (last rank; None on the others) and this rank's measured
    timeline (seconds since a common barrier).
    """
    s, p, m, v = comm.rank, comm.world_size, settings.num_microbatches, settings.num_chunks
    chunks = _chunks(stage, v, p)
    first, last = s == 0, s == p - 1
    for name, value, needed in (("X", X, first), ("y", y, last)):
        if needed and (value is None or value.shape[0] != settings.batch_size):
            got = "nothing" if value is None else f"{value.shape[0]} samples"
            raise ValueError(f"stage {s} needs {name} of {settings.batch_size} samples, got {got}")
    xs = X.chunk(m) if first else None
    ys = y.chunk(m) if last else None
    prev, nxt = (s - 1) % p, (s + 1) % p  # chunk c's neighbours; round the ring between chunks
    # (micro-batch, chunk) -> the input and output kept for its backward
    inputs: dict[tuple[int, int], torch.Tensor] = {}
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    sends: list[Handle] = []
    intervals: list[Interval] = []
    shapes: dict[int, tuple[int, ...]] = {}  # chunk -> the shape of its input
    peak, loss_sum = 0, 0.0
    # Activation bytes autograd saves in each micro-batch's forward (each storage once, the
    # parameters left out): held until that micro-batch's backward (lecture 11).
    params = {q.untyped_storage().data_ptr() for c in chunks for q in c.parameters()}
    saved: dict[tuple[int, int], int] = {}
    peak_bytes = 0

    def saving(key: tuple[int, int]):
        seen: set[tuple[int, int]] = set()
        saved[key] = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            # a view counts its own bytes (a micro-batch is a view of the batch), each tensor once
            ptr = (t.data_ptr(), t.nbytes)
            if t.nbytes and ptr not in seen and t.untyped_storage().data_ptr() not in params:
                seen.add(ptr)
                saved[key] += t.nbytes
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    comm.barrier()
    t0 = time.perf_counter()

    @contextmanager
    def timed(kind: str, i: int, c: int):
        start = time.perf_counter() - t0
        yield
        intervals.append(Interval(s, kind, i, start, time.perf_counter() - t0, c))

    def send(tensor: torch.Tensor, dst: int, tag: int) -> None:
        sends.append(comm.isend(tensor.detach().contiguous(), dst, tag))

    for action in schedule(settings.schedule, p, m, s):
        kind, i, c = action[0], action[1], action_chunk(action)
        k = c * p + s  # the model's stage this chunk holds
        begins, ends = k == 0, k == p * v - 1
        try:
            if kind == "F":
                if begins:
                    x = xs[i]
                else:
                    sender = (k - 1) // p  # the chunk that sends it (c, or c - 1 on rank 0)
                    with timed("recv", i, c):
                        if c not in shapes:  # the first activation brings its shape
                            head = comm.recv(np.zeros(8, np.int64), prev, _SHAPE_TAG + sender)
                            shapes[c] = tuple(int(d) for d in head[1 : 1 + head[0]])
                        x = comm.recv(torch.empty(shapes[c]), prev, _TAG0 + 2 * (sender * m + i))
                    x.requires_grad_()  # so that backward gives dL/dx to send back
                with timed("F", i, c), saving((i, c)):
                    out = chunks[c](x)
                    if ends:  # the loss of the batch is the mean of the micro-batch means
                        out = loss_fn(out, ys[i]) / m
                        loss_sum += out.item()
                inputs[i, c], outputs[i, c] = x, out
                peak = max(peak, len(inputs))
                peak_bytes = max(peak_bytes, sum(saved[key] for key in inputs))
                if not ends:
                    with timed("send", i, c):
                        if i == 0:  # every schedule's first forward: announce the shape once
                            head = np.zeros(8, np.int64)
                            head[0], head[1 : 1 + out.dim()] = out.dim(), out.shape
                            send(torch.from_numpy(head), nxt, _SHAPE_TAG + c)
                        send(out, nxt, _TAG0 + 2 * (c * m + i))
            else:
                out, x, grad = outputs.pop((i, c)), inputs.pop((i, c)), None
                if not ends:
                    sender = (k + 1) // p  # the chunk that sends it (c, or c + 1 on rank p - 1)
                    with timed("recv", i, c):
                        tag = _TAG0 + 2 * (sender * m + i) + 1
                        grad = comm.recv(torch.empty_like(out), nxt, tag)
                with timed("B", i, c):
                    if out.requires_grad:  # False only on a first stage without parameters
                        out.backward(grad)
                if not begins:
                    with timed("send", i, c):
                        send(x.grad, prev, _TAG0 + 2 * (c * m + i) + 1)
        except Exception as exc:  # name the stage and micro-batch; neighbours time out
            what = "forward" if kind == "F" else "backward"
            where = f" of chunk {c}" if v > 1 else ""
            raise PipelineStageError(
                f"stage {s} (rank {s} of {p}) failed in the {what} pass of micro-batch {i}"
                f"{where} ({settings.label}, m={m}): {type(exc).__name__}: {exc}",
                s,
                kind,
                i,
            ) from exc
    with timed("send", -1, 0):  # the last sends must have left before their buffers are freed
        wait_all(sends)
    return (loss_sum if last else None), Timeline(intervals, p, [peak], [peak_bytes])


def _chunks(stage: nn.Module | Sequence[nn.Module], v: int, p: int) -> list[nn.Module]:
    """Return the rank's model chunks as a list: ``[stage]`` without interleaving."""
    if v == 1:
        return [stage]
    if isinstance(stage, nn.Module) and not isinstance(stage, nn.ModuleList):
        raise ValueError(
            f"an interleaved schedule with {v} chunks needs a list of {v} modules per rank "
            f"(chunk c = stage c*p + rank), got one {type(stage).__name__}"
        )
    if len(stage) != v:
        raise ValueError(f"the schedule has {v} chunks per rank, but this rank got {len(stage)}")
    if p < 2:
        raise ValueError("interleaving needs at least 2 ranks: with one, use the plain schedules")
    return list(stage)
