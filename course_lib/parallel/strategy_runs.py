"""Lecture 13: A few of the simulator's strategies run for real on the engines, timed phase by phase.

The execution simulator (:mod:`course_lib.cost_model.simulator`, source 003) predicts a step
time; this module measures one. Four strategies of a kit model (a chain: convolutions, flatten,
dense layers), each run by the kit's own parallel code, each with the configuration tuple the
simulator reads (:func:`strategy_configs`):

- ``one worker``: rank 0 computes everything; the others only hand it their samples;
- ``data parallel``: every rank its own samples, then one ring allreduce of all the gradients
  after the backward pass (``course_lib.collectives.ring``; the simulator's
  ``sync="after_backward"``);
- ``hybrid``: Krizhevsky's data-parallel convolutions and model-parallel dense layers
  (:func:`~course_lib.parallel.model_parallel.hybrid.hybrid_step`, lecture 9);
- ``pipeline``: two stages, everything before the first dense layer on rank 0, the rest on
  rank 1, one micro-batch (:func:`~course_lib.parallel.pipeline_parallel.pipeline.pipeline_step`,
  lecture 10).

As in the simulator, every rank starts a step holding its own ``B/N`` samples and labels (it
loaded them): a strategy that computes them elsewhere moves them first, inside the step. A
step's time is the slowest rank's, from a barrier; each rank also records its phases
``(start, end, what)`` in seconds since that barrier, for a timeline beside the simulator's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

from course_lib.cost_model.configs import ParallelConfig, data_parallel, expert_hybrid
from course_lib.cost_model.operators import OperatorGraph

__all__ = ["STRATEGIES", "run_strategy", "strategy_configs"]

STRATEGIES = ("one worker", "data parallel", "hybrid", "pipeline")
_SAMPLES_TAG, _LABELS_TAG = 8113, 8114  # clear of the collectives' 8100-8112 and the probe's 8117


def _first_dense(graph: OperatorGraph) -> int:
    for i, op in enumerate(graph.ops):
        if op.kind == "linear":
            return i
    raise ValueError(f"{graph.name} has no dense (linear) layer to cut the pipeline before")


def strategy_configs(
    name: str, graph: OperatorGraph, world_size: int
) -> tuple[ParallelConfig, ...]:
    """Return the simulator's configuration of every operator under strategy ``name``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {STRATEGIES}")
    if name == "data parallel":
        return data_parallel(graph, world_size)
    if name == "hybrid":
        return expert_hybrid(graph, world_size)
    if name == "one worker":
        return tuple(ParallelConfig("replicate", (0,)) for _ in graph.ops)
    if world_size != 2:
        raise ValueError(f"the pipeline here has two stages: run it on 2 engines, not {world_size}")
    cut = _first_dense(graph)
    return tuple(ParallelConfig("replicate", (0 if i < cut else 1,)) for i in range(len(graph)))


_PIPELINE_PHASES = {"F": "forward", "B": "backward", "send": "send", "recv": "receive"}


class _Phases:
    """A step's clock (started at construction) and its phases ``(start, end, what)``."""

    def __init__(self) -> None:
        self.t0, self.items = time.perf_counter(), []

    def now(self) -> float:
        """Return the seconds since the step began."""
        return time.perf_counter() - self.t0

    @contextmanager
    def note(self, what: str):
        """Record the time the ``with`` body takes as phase ``what``."""
        start = self.now()
        yield
        self.items.append((start, self.now(), what))


def _gather_at(comm, dst: int, own, what: str, note):
    """Send every rank's ``own`` rows to ``dst``; return them all there, in rank order (else None)."""
    import torch

    tag = _SAMPLES_TAG if what == "samples" else _LABELS_TAG
    if comm.rank != dst:
        with note(f"send {what}"):
            comm.send(own.contiguous(), dst, tag)
        return None
    with note(f"receive {what}"):
        parts = [
            own if src == dst else comm.recv(torch.empty_like(own), src, tag)
            for src in range(comm.world_size)
        ]
    return torch.cat(parts)


def run_strategy(
    name: str, comm_name: str, model: str, batch: int, steps: int = 5, seed: int = 0
) -> dict[str, Any]:
    """Run 1 warm-up + ``steps`` steps of strategy ``name``; every engine calls it.

    A step is what the simulator models: forward, backward and the exchanges, no optimiser
    step. ``model`` is ``mlp``, ``lenet`` or ``small_cnn``, on random inputs. Returns this
    rank's wall seconds per step (from a barrier; warm-up excluded), the phases of its last
    step, and the bytes it sent in that step (the communicator's counter).
    """
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.collectives.ring import ring_allreduce
    from course_lib.parallel.model_parallel.hybrid import HybridCNN, hybrid_step
    from course_lib.parallel.pipeline_parallel.pipeline import (
        PipelineSettings,
        pipeline_step,
        split_stages,
    )
    from course_lib.training.models import build_model
    from course_lib.training.operator_graphs import kit_graph

    comm = get_ipython().user_ns[comm_name]
    p, r = comm.world_size, comm.rank
    graph = kit_graph(model, batch)
    strategy_configs(name, graph, p)  # bad names and world sizes fail here, on every rank
    if name == "hybrid" and not any(op.kind == "conv2d" for op in graph.ops):
        raise ValueError(f"the hybrid runs a CNN's convolutions data parallel; {model} has none")
    if batch % p:
        raise ValueError(
            f"a batch of {batch} does not split over {p} engines; use a multiple of {p}"
        )
    torch.manual_seed(seed)
    net = build_model(model)  # kit_graph(model) above: a chain the simulator knows
    X = torch.randn(batch, *graph.input_shape)
    y = torch.randint(0, net[-1].out_features, (batch,))
    own = slice(r * batch // p, (r + 1) * batch // p)
    X_own, y_own = X[own].contiguous(), y[own].contiguous()  # what this rank loaded
    hybrid = HybridCNN(net, comm) if name == "hybrid" else None
    if name == "pipeline":
        cut = _first_dense(graph)
        stage = split_stages(net, [(0, cut), (cut, len(net))])[r]
    walls, clock, sent = [], None, 0
    for step in range(steps + 1):
        comm.barrier()
        clock, before = _Phases(), comm.stats.bytes_sent
        note = clock.note
        net.zero_grad(set_to_none=True)
        if name == "one worker":
            Xa = _gather_at(comm, 0, X_own, "samples", note)
            ya = _gather_at(comm, 0, y_own, "labels", note)
            if r == 0:
                with note("forward"):
                    loss = nn.functional.cross_entropy(net(Xa), ya)
                with note("backward"):
                    loss.backward()
        elif name == "data parallel":
            with note("forward"):
                loss = nn.functional.cross_entropy(net(X_own), y_own)
            with note("backward"):
                loss.backward()
            with note("allreduce"):
                flat = torch.cat([q.grad.reshape(-1) for q in net.parameters()])
                ring_allreduce(comm, flat)  # a sum of means: divide by p before a step
        elif name == "hybrid":
            with note("hybrid step"):
                hybrid_step(hybrid, X_own, y_own)
        else:  # two-stage pipeline: stage 0 needs every sample, stage 1 every label
            Xa = _gather_at(comm, 0, X_own, "samples", note)
            ya = _gather_at(comm, 1, y_own, "labels", note)
            start = clock.now()
            _, timeline = pipeline_step(stage, comm, PipelineSettings("naive", 1, batch), Xa, ya)
            for iv in timeline.intervals:  # seconds since pipeline_step's own barrier
                what = _PIPELINE_PHASES.get(iv.kind, iv.kind)
                clock.items.append((start + iv.start, start + iv.end, what))
        wall = clock.now()
        sent = comm.stats.bytes_sent - before
        if step:  # the first step warms up buffers and connections
            walls.append(wall)
    return {"walls": walls, "phases": sorted(clock.items), "bytes_sent": sent}
