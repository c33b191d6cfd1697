"""Lecture 13: The execution simulator: a strategy's step time without running it (source 003).

FlexFlow's simulation: a task starts when its predecessors have ended and its device (a worker
or a link) is free; the ready task with the earliest ready time goes first, ties by task id, so
the result is deterministic. The step time is the last task's end. From the same run come a
per-device timeline, each worker's bytes and messages sent and its peak memory (its model
state: weights, their gradients and optimiser state, sharded under ZeRO; plus the activations
kept from a forward shard until its backward shard ends).

The delta simulation re-uses a previous run when a strategy changes in one operator: ready
times never decrease in pop order, so every pop of the old run before (a) the first changed or
removed task and (b) the earliest moment a changed task could become ready happens identically
in the new run; the simulation restarts from there. ``tests/lib/strategy/test_simulator.py`` checks it equals
the full simulation after random changes; ``bench/bench_simulator.py`` times both.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from dataclasses import dataclass, field

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.configs import ParallelConfig
from course_lib.cost_model.messages import Network, Task
from course_lib.cost_model.operators import OperatorGraph
from course_lib.cost_model.sharding import ZeroConfig
from course_lib.cost_model.task_graph import TaskGraphBuilder

__all__ = ["Simulation", "Simulator", "simulate", "simulate_delta"]


@dataclass
class Simulation:
    """One simulated step: every task's start and end, in the order the simulator ran them."""

    tasks: dict[str, Task]
    start: dict[str, float]
    end: dict[str, float]
    order: list[str]
    ready: list[float]  # ready time of each task in ``order`` (non-decreasing)
    resumed_at: int = 0  # tasks taken from the previous run (delta), 0 for a full run
    param_bytes: dict[int, float] = field(default_factory=dict)
    state_bytes: dict[int, float] = field(default_factory=dict)  # weights, grads, optimiser

    @property
    def step_time(self) -> float:
        """Return the predicted seconds of one training step (the last task's end)."""
        return max(self.end.values(), default=0.0)

    def timeline(self) -> dict[tuple, list[tuple[float, float, str]]]:
        """Return per device (worker or link) its tasks as ``(start, end, id)`` in time order."""
        out = defaultdict(list)
        for tid in self.order:
            out[self.tasks[tid].device].append((self.start[tid], self.end[tid], tid))
        return dict(out)

    def bytes_sent(self) -> dict[int, float]:
        """Return the bytes each worker sends in one step."""
        out = defaultdict(float)
        for t in self.tasks.values():
            if t.device[0] == "link":
                out[t.src] += t.nbytes
        return dict(out)

    def messages_sent(self) -> dict[int, int]:
        """Return the point-to-point messages each worker sends in one step."""
        out = defaultdict(int)
        for t in self.tasks.values():
            if t.device[0] == "link":
                out[t.src] += 1
        return dict(out)

    def peak_memory(self) -> dict[int, float]:
        """Return each worker's peak bytes: its model state (:attr:`state_bytes`; without it
        weights and gradients), plus live activations. A ZeRO stage's transient buffers (a
        bucket's full gradients, a gathered layer) are not counted."""
        events = defaultdict(list)
        for tid, t in self.tasks.items():
            if t.device[0] == "worker" and t.memory:
                # at equal times frees go first: a freed buffer can be reused at once
                events[t.device[1]].append((self.end[tid], t.memory))
        peak = {}
        for d in set(events) | set(self.param_bytes) | set(self.state_bytes):
            live = top = 0.0
            for _, m in sorted(events[d]):
                live += m
                top = max(top, live)
            state = self.state_bytes.get(d, 2 * self.param_bytes.get(d, 0.0))
            peak[d] = state + top
        return peak


def _links(tasks: dict[str, Task]):
    succ, npred = defaultdict(list), {}
    for tid, t in tasks.items():
        npred[tid] = len(t.preds)
        for p in t.preds:
            succ[p].append(tid)
    return succ, npred


def _run(tasks, prefix_order=(), old=None) -> Simulation:
    """Simulate ``tasks``, first replaying ``prefix_order`` from ``old`` unchanged."""
    succ, waiting = _links(tasks)
    missing = {p for t in tasks.values() for p in t.preds if p not in tasks}
    if missing:
        raise ValueError(f"tasks wait on unknown tasks {sorted(missing)[:5]}: the graph is broken")
    start, end, order, readies, free = {}, {}, [], [], defaultdict(float)
    for k, tid in enumerate(prefix_order):
        start[tid], end[tid] = old.start[tid], old.end[tid]
        order.append(tid)
        readies.append(old.ready[k])
        free[tasks[tid].device] = end[tid]
        for s in succ[tid]:
            waiting[s] -= 1
    heap = [
        (max((end[p] for p in t.preds), default=0.0), tid)
        for tid, t in tasks.items()
        if not waiting[tid] and tid not in end
    ]
    heapq.heapify(heap)
    while heap:
        ready, tid = heapq.heappop(heap)
        t = tasks[tid]
        s = max(ready, free[t.device])
        start[tid], end[tid] = s, s + t.seconds
        free[t.device] = end[tid]
        order.append(tid)
        readies.append(ready)
        for n in succ[tid]:
            waiting[n] -= 1
            if not waiting[n]:
                heapq.heappush(heap, (max(end[p] for p in tasks[n].preds), n))
    if len(order) != len(tasks):
        raise ValueError("the task graph has a cycle: some tasks never became ready")
    return Simulation(tasks, start, end, order, readies, len(prefix_order))


def simulate(tasks: dict[str, Task]) -> Simulation:
    """Return the full event-by-event simulation of ``tasks``."""
    return _run(tasks)


def simulate_delta(old: Simulation, tasks: dict[str, Task]) -> Simulation:
    """Return the simulation of ``tasks``, replaying the part of ``old`` the changes cannot touch.

    Equal to :func:`simulate` (same starts, ends and order), only faster when few tasks changed.
    """
    pos = {tid: k for k, tid in enumerate(old.order)}
    get = old.tasks.get  # cached segments hand back the same Task objects: test identity first
    changed = {tid for tid, t in tasks.items() if (o := get(tid)) is not t and o != t}
    cut = min(
        [pos[tid] for tid in changed if tid in pos]
        + [pos[tid] for tid in old.tasks if tid not in tasks]
        + [len(old.order)]
    )
    for tid in changed:
        preds = tasks[tid].preds
        if any(p in changed for p in preds):
            continue  # it cannot be ready before its changed predecessor, counted on its own
        ready = max((old.end[p] for p in preds), default=0.0)
        after = max((pos[p] for p in preds), default=-1) + 1
        cut = min(cut, max(after, bisect.bisect_left(old.ready, ready)))
    return _run(tasks, old.order[:cut], old)


class Simulator:
    """Predict step times of strategies for ``graph`` on ``world_size`` workers.

    ``link``: one :class:`LinkModel` for every pair of workers, or a
    :class:`~course_lib.cost_model.messages.Network` that also says what a message occupies;
    ``sync``: when gradients of replicated weights are summed (see
    :class:`~course_lib.cost_model.task_graph.TaskGraphBuilder`); ``zero``: ZeRO's stage
    (:class:`~course_lib.cost_model.sharding.ZeroConfig`) for a data-parallel strategy;
    ``optimizer_bytes``: optimiser state per weight value in the memory count (Adam 8, SGD with
    momentum 4, plain SGD 0).
    """

    def __init__(
        self,
        graph: OperatorGraph,
        world_size: int,
        costs,
        link: LinkModel | Network,
        sync: str = "per_operator",
        zero: ZeroConfig | None = None,
        optimizer_bytes: int = 0,
    ) -> None:
        if optimizer_bytes < 0:
            raise ValueError(f"optimizer_bytes must be >= 0 (Adam: 8), got {optimizer_bytes}")
        self.graph, self.world_size, self.optimizer_bytes = graph, world_size, optimizer_bytes
        self.builder = TaskGraphBuilder(graph, world_size, costs, link, sync, zero)

    def _finish(self, sim: Simulation, strategy) -> Simulation:
        sim.param_bytes = self.builder.param_bytes(strategy)
        sim.state_bytes = self.builder.state_bytes(strategy, self.optimizer_bytes)
        return sim

    def run(self, strategy: tuple[ParallelConfig, ...]) -> Simulation:
        """Return the full simulation of ``strategy`` (its task graph rebuilt from scratch)."""
        self.builder.clear()
        return self._finish(simulate(self.builder.build(tuple(strategy))), strategy)

    def delta(self, old: Simulation, strategy: tuple[ParallelConfig, ...]) -> Simulation:
        """Return the simulation of ``strategy`` re-using ``old`` and the cached segments."""
        return self._finish(simulate_delta(old, self.builder.build(tuple(strategy))), strategy)
