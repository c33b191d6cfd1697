"""Lecture 13: ZeRO's sharded data parallelism as the simulator's tasks and per-worker memory.

ZeRO (Rajbhandari et al. 2020; lecture 11, :mod:`course_lib.parallel.sharded.zero`) keeps data
parallelism's split by samples but cuts the model state into ``N`` shards. For the simulator
(source 003) that changes two things: which messages a step sends and what each worker holds.

- Messages: a ring allreduce cut in two passes, each of ``N - 1`` steps of one chunk per
  worker, chunks laid out as the kit's ring lays them (``chunk_bounds``: the first ones one
  value longer), so the simulated bytes are the counted bytes. Stage 1 reduce-scatters one unit
  (the whole gradient) after backward, updates the shard and allgathers it; stage 2 reduce-
  scatters each gradient bucket (about ``bucket_bytes``, parameters in reverse order) as
  backward completes it, then allgathers every bucket after the update; stage 3 allgathers
  each layer's weights before its forward and again before its backward, and reduce-scatters
  its gradients after its backward (no allgather after the update).
- Order: the kit's exchanges run their collectives from hooks on the engine's one thread, so a
  worker issues them one after another and its next forward or backward waits for them (no
  overlap: measured in lecture 11). :func:`zero_schedule` lists them in that order.
- Memory per worker, float32 with ``k`` bytes of optimiser state per value (Adam: 8):
  DDP $(8+k)\\Psi$, stage 1 $8\\Psi + k\\Psi/N$, stage 2 $4\\Psi + (4+k)\\Psi/N$, stage 3
  $(8+k)\\Psi/N$ (:func:`course_lib.parallel.sharded.ledger.formula_bytes`), with each shard
  the worker's exact chunk of each unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.comm.buffers import chunk_bounds
from course_lib.cost_model.configs import ParallelConfig
from course_lib.cost_model.messages import Network, Task, message
from course_lib.cost_model.operators import BYTES, OperatorGraph

__all__ = [
    "Collective",
    "Unit",
    "ZeroConfig",
    "check_zero",
    "ring_pass_done",
    "ring_pass_tasks",
    "zero_schedule",
    "zero_state_bytes",
    "zero_units",
]


@dataclass(frozen=True)
class ZeroConfig:
    """ZeRO ``stage`` (1-3) and stage 2's gradient ``bucket_bytes`` (the kit's default 64 KiB)."""

    stage: int
    bucket_bytes: int = 1 << 16

    def __post_init__(self) -> None:
        if self.stage not in (1, 2, 3):
            raise ValueError(
                f"ZeRO has stages 1, 2 and 3, got {self.stage!r}; for plain data parallelism "
                "leave zero=None"
            )
        if self.bucket_bytes < BYTES:
            raise ValueError(
                f"bucket_bytes must be at least one float32 (4), got {self.bucket_bytes}"
            )


@dataclass(frozen=True)
class Unit:
    """Parameters reduced together: ``numel`` values, complete when op ``trigger``'s backward ends."""

    index: int
    numel: int
    trigger: int


@dataclass(frozen=True)
class Collective:
    """One ring pass a worker issues: ``phase`` ``"rs"`` or ``"ag"`` over a unit's values."""

    tag: str
    phase: str
    numel: int


def _tensors(graph: OperatorGraph) -> list[tuple[int, int]]:
    """Return ``(op, values)`` of every parameter tensor, weight then bias, in registration order."""
    out = []
    for i, op in enumerate(graph.ops):
        if op.has_params:
            bias = op.out_shape[0]  # every kit layer with weights has one bias per output channel
            out += [(i, op.params - bias), (i, bias)]
    return out


def zero_units(graph: OperatorGraph, zero: ZeroConfig) -> list[Unit]:
    """Return the units the kit's ``plan_units`` makes for ``graph`` at ``zero.stage``."""
    tensors = _tensors(graph)
    if zero.stage == 1:
        return [Unit(0, sum(v for _, v in tensors), min(i for i, _ in tensors))]
    if zero.stage == 3:
        return [Unit(k, op.params, i) for k, (i, op) in enumerate(
            (i, op) for i, op in enumerate(graph.ops) if op.has_params
        )]  # fmt: skip
    units, current = [], []
    for i, v in reversed(tensors):  # backward produces the last layer's gradients first
        current.append((i, v))
        if sum(x for _, x in current) * BYTES >= zero.bucket_bytes:
            units.append(Unit(len(units), sum(x for _, x in current), min(j for j, _ in current)))
            current = []
    if current:
        units.append(Unit(len(units), sum(x for _, x in current), min(j for j, _ in current)))
    return units


def check_zero(graph: OperatorGraph, strategy: tuple[ParallelConfig, ...]) -> tuple[int, ...]:
    """Return the workers of a ZeRO strategy; raise naming the fix unless it is data parallel."""
    devices = strategy[0].devices
    for op, cfg in zip(graph.ops, strategy, strict=True):
        if cfg.split != "sample" or cfg.devices != devices or cfg.degree < 2:
            raise ValueError(
                f"{op.name}: {cfg}: ZeRO shards data parallelism, so every operator must be split "
                f"by samples over the same two or more workers; use data_parallel(graph, N)"
            )
    if not any(op.has_params for op in graph.ops):
        raise ValueError(f"{graph.name} has no weights to shard; leave zero=None")
    return devices


def zero_schedule(graph: OperatorGraph, zero: ZeroConfig) -> dict[str, list]:
    """Return the collectives a worker issues, in order, and where compute waits for them.

    ``"order"``: ``(after, collective)`` pairs: the collective starts once the compute task
    named ``after`` (``("F", i)`` or ``("B", i)``, or ``("B", "all")``: the whole backward)
    has ended and the previous collective is done. ``"forward"`` / ``"backward"``: op index ->
    tag of the collective its forward / backward waits for.
    """
    units, last = zero_units(graph, zero), len(graph.ops) - 1
    order, fwd, bwd = [], {}, {}
    by_trigger = {}
    for u in units:
        by_trigger.setdefault(u.trigger, []).append(u)
    if zero.stage == 3:
        for u in units:  # each layer's weights gathered just before its forward
            tag = f"{u.trigger:03d}Zf"
            order.append(
                (("F", u.trigger - 1) if u.trigger else None, Collective(tag, "ag", u.numel))
            )
            fwd[u.trigger] = tag
    pending = None  # the last collective issued in backward: the next backward waits for it
    for i in range(last, -1, -1):
        if pending is not None:
            bwd[i] = pending
        if zero.stage == 3 and i in by_trigger:  # gathered again when backward reaches it
            tag = f"{i:03d}Zb"
            order.append((("B", i + 1), Collective(tag, "ag", by_trigger[i][0].numel)))
            bwd[i] = tag
        pending = None
        if zero.stage >= 2:
            for u in by_trigger.get(i, []):
                tag = f"{i:03d}Zr{u.index}"
                order.append((("B", i), Collective(tag, "rs", u.numel)))
                pending = tag
    if zero.stage <= 2:  # after the whole backward: (stage 1) reduce-scatter, update, allgather
        if zero.stage == 1:
            order.append((("B", "all"), Collective("ZR0", "rs", units[0].numel)))
        for u in units:
            order.append((("B", "all"), Collective(f"ZA{u.index}", "ag", u.numel)))
    return {"order": order, "forward": fwd, "backward": bwd}


def _ids(tag: str, devices: tuple[int, ...], step: int) -> list[str]:
    n = len(devices)
    return [f"{tag}{step}:{devices[j]}>{devices[(j + 1) % n]}" for j in range(n)]


def ring_pass_done(tag: str, devices: tuple[int, ...], d: int) -> str:
    """Return the id of the last message worker ``d`` receives in ring pass ``tag``."""
    n, j = len(devices), devices.index(d)
    return _ids(tag, devices, n - 2)[(j - 1) % n]


def ring_pass_tasks(
    tag: str, devices: tuple[int, ...], numel: int, phase: str, start: dict, link: Network
) -> list[Task]:
    """Return the messages of one ring reduce-scatter (``phase="rs"``) or allgather (``"ag"``).

    Step k (0 .. N-2): worker ``devices[j]`` sends chunk ``j-k-1`` (reduce-scatter) or ``j-k``
    (allgather) to ``devices[j+1]``, after ``start[d]`` and the message it received in step k-1;
    chunks as :func:`~course_lib.comm.buffers.chunk_bounds` cuts ``numel`` float32 values.
    """
    n, bounds = len(devices), chunk_bounds(numel, len(devices))
    shift = 1 if phase == "rs" else 0
    tasks = []
    for k in range(n - 1):
        ids, prev = _ids(tag, devices, k), _ids(tag, devices, k - 1) if k else None
        for j, d in enumerate(devices):
            a, b = bounds[(j - k - shift) % n]
            preds = list(start.get(d, [])) + ([prev[(j - 1) % n]] if prev else [])
            tasks.append(
                message(
                    ids[j], d, devices[(j + 1) % n], BYTES * (b - a), preds, link, phase == "rs"
                )
            )
    return tasks


def zero_state_bytes(
    graph: OperatorGraph, zero: ZeroConfig, devices: tuple[int, ...], optimizer_bytes: int
) -> dict[int, float]:
    """Return each worker's settled model-state bytes: weights, gradients, optimiser state."""
    units, n = zero_units(graph, zero), len(devices)
    psi = sum(u.numel for u in units)
    out = {}
    for j, d in enumerate(devices):
        shard = sum(b - a for u in units for a, b in [chunk_bounds(u.numel, n)[j]])
        weights = shard if zero.stage == 3 else psi
        grads = shard if zero.stage >= 2 else psi
        out[d] = float(BYTES * (weights + grads) + optimizer_bytes * shard)
    return out
