"""Lecture 15: lecture 13's simulator on a (dp, tp, pp, cp) grid: one TinyGPT step as tasks, predicted.

The same event simulation as lecture 13 (:func:`course_lib.cost_model.simulator.simulate`: a
task starts when its predecessors have ended and its device is free), fed the tasks of one 3D
step: each rank runs its pipeline stage's 1F1B actions in order (lecture 10's schedule), each
action a chain of measured pieces (:mod:`course_lib.parallel.grid.costs3d`) with a tensor
allreduce after each half block (:func:`~course_lib.cost_model.messages.ring_allreduce_tasks`
over the tensor line), context parallelism's key / value blocks passed round its ring after
each attention, the activation (forward) or its gradient (backward) sent to the neighbouring
stage, and at the end one allreduce of the rank's gradients over the data (and context) line.
Ranks are numbered row-major over (data, pipeline, context, tensor), as
:class:`~course_lib.parallel.grid.mesh.ProcessGrid` numbers (data, pipeline, tensor).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from course_lib.cost_model.messages import Network, Task, message, network, ring_allreduce_tasks
from course_lib.cost_model.simulator import Simulation, simulate
from course_lib.parallel.grid.costs3d import PieceCosts
from course_lib.parallel.grid.equality3d import grid_params
from course_lib.parallel.pipeline_parallel.pipeline import even_stages
from course_lib.parallel.pipeline_parallel.schedule import schedule
from course_lib.parallel.transformer.formulas import FLOAT

__all__ = ["Grid", "grid_tasks", "predict_grid"]


@dataclass(frozen=True)
class Grid:
    """Degrees of data, tensor, pipeline and context parallelism; their product is the world."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        """Return the ranks the grid needs."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def label(self) -> str:
        """Return e.g. ``'dp2 tp2 pp2 cp1'``."""
        return f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp}"

    def rank(self, d: int, s: int, c: int, t: int) -> int:
        """Return the rank at data ``d``, stage ``s``, context ``c``, tensor ``t``."""
        return ((d * self.pp + s) * self.cp + c) * self.tp + t


def _ring_pass(tag, devices, nbytes, steps, start, link) -> tuple[list[Task], dict]:
    """Each device sends ``nbytes`` to the next ``steps`` times, each after receiving (a ring)."""
    n = len(devices)
    if n == 1 or steps == 0:
        return [], {d: list(start[d]) for d in devices}
    tasks, got = [], {d: list(start[d]) for d in devices}
    for k in range(steps):
        sent = {}
        for i, d in enumerate(devices):
            nxt = devices[(i + 1) % n]
            tid = f"{tag}k{k}:{d}>{nxt}"
            tasks.append(message(tid, d, nxt, nbytes, got[d], link))
            sent[nxt] = tid
        got = {d: list(start[d]) + [sent[d]] for d in devices}
    return tasks, got


def grid_tasks(
    grid: Grid,
    sizes: dict,
    batch: int,
    length: int,
    num_microbatches: int,
    costs: PieceCosts,
    link: Network,
    data_factor: float = 1.0,
    compute_scale: float = 1.0,
    call_seconds: float = 0.0,
) -> tuple[dict[str, Task], dict[int, float]]:
    """Return the tasks of one step on ``grid`` and each rank's model-state bytes (Adam, float32).

    ``data_factor`` scales the data axis's bytes (1.5 when ZeRO-3 gathers the weights too);
    ``compute_scale`` the pieces' seconds (ranks sharing cores: engines per core);
    ``call_seconds`` is what a collective costs its caller before any byte moves (the
    communicator's own work, paid even on a line of one rank), a task on the worker.
    """
    link, m = network(link), num_microbatches
    b, tokens, d = batch // (grid.dp * m), length // grid.cp, sizes["d_model"]
    act, loss = b * tokens * d * FLOAT, b * tokens * FLOAT
    tasks: dict[str, Task] = {}
    last: dict[int, list[str]] = {}  # each rank's latest task(s): its actions run in order
    dims = {"data": grid.dp, "pipeline": grid.pp, "tensor": grid.tp}
    for dd, s in itertools.product(range(grid.dp), range(grid.pp)):
        # the stage's ranks: a tensor line per context rank, a context line per tensor rank
        lines = [[grid.rank(dd, s, c, t) for t in range(grid.tp)] for c in range(grid.cp)]
        rings = [[grid.rank(dd, s, c, t) for c in range(grid.cp)] for t in range(grid.tp)]
        everyone = [w for line in lines for w in line]
        a, z = even_stages(sizes["n_layer"], grid.pp)[s]
        first, final = s == 0, s == grid.pp - 1
        for w in everyone:
            last[w] = []
        for kind, i, *_ in schedule("1f1b", grid.pp, m, s):
            tag = f"{kind}{i}@{dd}.{s}"
            for c, t in itertools.product(range(grid.cp), range(grid.tp)):
                w = lines[c][t]
                if kind == "F" and not first:  # the previous stage's activation, micro-batch i
                    last[w] = last[w] + [f"pF{i}:{grid.rank(dd, s - 1, c, t)}>{w}"]
                if kind == "B" and not final:  # the next stage's gradient for it
                    last[w] = last[w] + [f"pB{i}:{grid.rank(dd, s + 1, c, t)}>{w}"]
            pieces = _pieces(kind, first, final, z - a, costs, act, loss)
            for k, (seconds, memory, reduced, ring) in enumerate(pieces):
                for w in everyone:
                    tid = f"{tag}p{k}:{w}"
                    tasks[tid] = Task(
                        tid, ("worker", w), seconds * compute_scale, tuple(last[w]), memory=memory
                    )
                    last[w] = [tid]
                if ring:  # context parallelism: key / value blocks round each context line
                    for t, cl in enumerate(rings):
                        new, done = _ring_pass(f"{tag}r{k}t{t}", cl, ring, grid.cp - 1, last, link)
                        tasks.update((x.id, x) for x in new)
                        last.update(done)
                for n, nbytes in enumerate(reduced):
                    for w in everyone if call_seconds else ():
                        tid = f"{tag}o{k}.{n}:{w}"
                        tasks[tid] = Task(tid, ("worker", w), call_seconds, tuple(last[w]))
                        last[w] = [tid]
                    for c, line in enumerate(lines):
                        new, done = ring_allreduce_tasks(
                            f"{tag}a{k}.{n}c{c}", line, nbytes, last, link
                        )
                        tasks.update((x.id, x) for x in new)
                        last.update({w: done[w] for w in line})
            if (kind == "F" and not final) or (kind == "B" and not first):
                to = s + 1 if kind == "F" else s - 1
                for c, t in itertools.product(range(grid.cp), range(grid.tp)):
                    w, dst = lines[c][t], grid.rank(dd, to, c, t)
                    tid = f"p{kind}{i}:{w}>{dst}"
                    tasks[tid] = message(tid, w, dst, act, last[w], link)
    state = {}
    for s, t in itertools.product(range(grid.pp), range(grid.tp)):
        params = grid_params(sizes, dims, {"pipeline": s, "tensor": t})
        replicas = [grid.rank(dd, s, c, t) for dd in range(grid.dp) for c in range(grid.cp)]
        nbytes = params * FLOAT * data_factor
        new, _ = ring_allreduce_tasks(f"dp{s}.{t}", replicas, nbytes, last, link)
        tasks.update((x.id, x) for x in new)
        state.update({w: 4.0 * FLOAT * params for w in replicas})
    return tasks, state


def _pieces(kind, first, final, layers, costs: PieceCosts, act, loss):
    """Return one action's pieces: (seconds, activation bytes, allreduce sizes after, ring bytes)."""
    half_f, half_b = costs.block[0] / 2, costs.block[1] / 2
    kv = 2 * act  # a block of keys and one of values
    saved = costs.saved
    if kind == "F":
        out = [(costs.embed[0], saved["embed"], [act], 0)] if first else []
        for _ in range(layers):  # attention, its allreduce; the MLP, its allreduce
            out += [(half_f, saved["block"] / 2, [act], kv), (half_f, saved["block"] / 2, [act], 0)]
        if final:
            out.append((costs.head[0], saved["head"], [loss, loss, loss], 0))
        return out
    out = [(costs.head[1], -saved["head"], [act], 0)] if final else []
    for _ in range(
        layers
    ):  # the MLP's backward, its allreduce; attention's, the ring, its allreduce
        out += [
            (half_b, -saved["block"] / 2, [act], 0),
            (half_b, -saved["block"] / 2, [act], 2 * kv),
        ]
    if first:
        out.append((costs.embed[1], -saved["embed"], [], 0))
    return out


def predict_grid(
    grid: Grid,
    sizes: dict,
    batch: int,
    length: int,
    num_microbatches: int,
    costs: PieceCosts,
    link: Network,
    data_factor: float = 1.0,
    compute_scale: float = 1.0,
    call_seconds: float = 0.0,
) -> Simulation:
    """Return the simulated step of ``grid`` (its ``step_time``, bytes per rank, peak memory)."""
    for name, value, over in (
        ("batch", batch, grid.dp * num_microbatches),
        ("length", length, grid.cp),
    ):
        if value % over:
            raise ValueError(f"{name} {value} does not divide into {over} parts on {grid.label}")
    tasks, state = grid_tasks(
        grid,
        sizes,
        batch,
        length,
        num_microbatches,
        costs,
        link,
        data_factor,
        compute_scale,
        call_seconds,
    )
    sim = simulate(tasks)
    sim.state_bytes = state
    return sim
