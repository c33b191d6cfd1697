"""Lecture 13: The simulator's strategies run for real on the engines, timed phase by phase.

The execution simulator (:mod:`course_lib.cost_model.simulator`, source 003) predicts a step
time; this module measures one. Strategies of a kit model (a chain: convolutions, flatten,
dense layers), each run by the kit's own parallel code, each with the configuration tuple
(:func:`strategy_configs`) and simulator options (:func:`simulator_options`) the simulator reads:

- ``one worker``: rank 0 computes everything; the others only hand it their samples;
- ``data parallel``: every rank its own samples, then one ring allreduce of all the gradients
  after the backward pass (``course_lib.collectives.ring``; the simulator's
  ``sync="after_backward"``);
- ``hybrid``: Krizhevsky's data-parallel convolutions and model-parallel dense layers
  (:func:`~course_lib.parallel.model_parallel.hybrid.hybrid_step`, lecture 9); on an MLP (no
  convolutions) the Megatron pair alone, every rank's samples gathered first;
- ``pipeline``: two stages, everything before the first dense layer on rank 0, the rest on
  rank 1, one micro-batch (:func:`~course_lib.parallel.pipeline_parallel.pipeline.pipeline_step`,
  lecture 10);
- ``attribute``: every layer before the Flatten split by image height (source 003's attribute
  dimension: halo rows exchanged before each convolution, their gradients sent back), the
  bands gathered, the dense head replicated on every rank
  (:mod:`course_lib.parallel.model_parallel.spatial`);
- ``zero1``, ``zero2``, ``zero3``: data parallelism with ZeRO's sharding (lecture 11, the kit's
  own :mod:`~course_lib.parallel.sharded.zero` exchanges): reduce-scatter, the shard's update,
  allgather; stage 3 gathers each layer's weights before its forward and its backward;
  ``zero2/16K`` and ``zero2/1M``: stage 2 with 16 KiB or 1 MiB gradient buckets (the others use
  ``bucket_bytes``, 64 KiB by default).

As in the simulator, every rank starts a step holding its own ``B/N`` samples and labels (it
loaded them): a strategy that computes them elsewhere moves them first, inside the step. A
step's time is the slowest rank's, from a barrier; each rank also records its phases
``(start, end, what)`` in seconds since that barrier, for a timeline beside the simulator's.
With ``lr > 0`` every step ends with an optimiser step on what each rank holds, and
:func:`~course_lib.parallel.strategy_weights.whole_weights` puts the ranks' pieces back together:
every strategy is the same computation, so they equal
:func:`~course_lib.parallel.strategy_weights.one_process_weights` (the test's reference). ZeRO's step
always includes its update (the allgather of the updated shards follows it).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

from course_lib.cost_model.configs import ParallelConfig, data_parallel, expert_hybrid
from course_lib.cost_model.operators import OperatorGraph

__all__ = ["ALL_STRATEGIES", "STRATEGIES", "run_strategy", "simulator_options", "strategy_configs"]

STRATEGIES = (
    "one worker",
    "data parallel",
    "hybrid",
    "pipeline",
    "attribute",
    "zero1",
    "zero2",
    "zero3",
)
#: ZeRO-2 with another gradient bucket than the run's ``bucket_bytes``: more, smaller messages
#: (16 KiB) or fewer, larger ones (1 MiB); the simulator's units follow (``ZeroConfig``).
_BUCKETS = {"zero2/16K": 1 << 14, "zero2/1M": 1 << 20}
#: Lecture 13 shows :data:`STRATEGIES`; the scoreboard (``bench/bench_strategy_scoreboard.py``)
#: and the tests run these ten.
ALL_STRATEGIES = STRATEGIES + tuple(_BUCKETS)
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
    if name not in ALL_STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {ALL_STRATEGIES}")
    if name == "data parallel" or name.startswith("zero"):
        return data_parallel(graph, world_size)
    if name == "hybrid":
        return expert_hybrid(graph, world_size)
    if name == "one worker":
        return tuple(ParallelConfig("replicate", (0,)) for _ in graph.ops)
    if name == "attribute":
        every = tuple(range(world_size))
        flat = next(i for i, op in enumerate(graph.ops) if op.kind == "flatten")
        return tuple(
            ParallelConfig("attribute" if i < flat else "replicate", every)
            for i in range(len(graph))
        )
    if world_size != 2:
        raise ValueError(f"the pipeline here has two stages: run it on 2 engines, not {world_size}")
    cut = _first_dense(graph)
    return tuple(ParallelConfig("replicate", (0 if i < cut else 1,)) for i in range(len(graph)))


def simulator_options(name: str, bucket_bytes: int = 1 << 16) -> dict[str, Any]:
    """Return the ``Simulator`` keywords that model how strategy ``name`` runs here.

    Every strategy sums replicated gradients after the backward pass (the kit's ring exchange,
    ``hybrid_step``); the ZeRO strategies add their stage and stage 2's bucket size.
    """
    if name not in ALL_STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {ALL_STRATEGIES}")
    out: dict[str, Any] = {"sync": "after_backward"}
    if name.startswith("zero"):
        from course_lib.cost_model.sharding import ZeroConfig

        out["zero"] = ZeroConfig(int(name[4]), _BUCKETS.get(name, bucket_bytes))
    return out


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
    name: str,
    comm_name: str,
    model: str,
    batch: int,
    steps: int = 5,
    seed: int = 0,
    *,
    lr: float = 0.0,
    optimizer: str = "sgd",
    bucket_bytes: int = 1 << 16,
) -> dict[str, Any]:
    """Run 1 warm-up + ``steps`` steps of strategy ``name``; every engine calls it.

    A step is what the simulator models: forward, backward and the exchanges; with ``lr > 0``
    (and always for ZeRO) an optimiser step (``optimizer``: ``sgd`` or ``adam``) on what this
    rank holds. ``model`` is ``mlp``, ``lenet`` or ``small_cnn``, on random inputs. Returns this
    rank's wall seconds per step (from a barrier; warm-up excluded), the phases of its last
    step, the bytes and messages it sent in that step (the communicator's counters), its
    pieces of the weights after the run (when it updated them) and, for ZeRO, the memory
    ledger of its last step (``course_lib.parallel.sharded.ledger``).
    """
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.collectives.ring import ring_allreduce
    from course_lib.parallel.exchanges.base import StepTimeline
    from course_lib.parallel.model_parallel.hybrid import HybridCNN, hybrid_step
    from course_lib.parallel.model_parallel.spatial import HeightSplitCNN, height_split_step
    from course_lib.parallel.pipeline_parallel.pipeline import (
        PipelineSettings,
        pipeline_step,
        split_stages,
    )
    from course_lib.parallel.strategy_weights import make_optimizer, pieces, problem

    comm = get_ipython().user_ns[comm_name]
    p, r = comm.world_size, comm.rank
    graph, net, X, y = problem(model, batch, seed)
    strategy_configs(name, graph, p)  # bad names and world sizes fail here, on every rank
    if name == "attribute" and not any(op.kind == "conv2d" for op in graph.ops):
        raise ValueError(f"the {name} strategy splits a CNN's convolutions; {model} has none")
    if batch % p:
        raise ValueError(
            f"a batch of {batch} does not split over {p} engines; use a multiple of {p}"
        )
    own = slice(r * batch // p, (r + 1) * batch // p)
    X_own, y_own = X[own].contiguous(), y[own].contiguous()  # what this rank loaded
    zero = name.startswith("zero")
    updates = lr > 0 or zero
    parts, exchange, cut = net, None, _first_dense(graph) if name == "pipeline" else 0
    if name == "hybrid":
        parts = HybridCNN(net, comm)
    elif name == "attribute":
        parts = HeightSplitCNN(net, graph, comm)
    elif name == "pipeline":
        parts = split_stages(net, [(0, cut), (cut, len(net))])[r]
    elif zero:
        from course_lib.parallel.exchanges.registry import make_exchange

        exchange = make_exchange(name[:5], bucket_bytes=_BUCKETS.get(name, bucket_bytes))
        exchange.attach(comm, net)
    opt = make_optimizer(optimizer, parts.parameters(), lr) if updates else None
    if zero:
        opt = exchange.wrap_optimizer(comm, opt)
    walls, clock, sent, messages, ledger = [], None, 0, 0, {}
    for step in range(steps + 1):
        comm.barrier()
        clock, before = _Phases(), (comm.stats.bytes_sent, comm.stats.messages_sent)
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
                grads = [q.grad for q in net.parameters()]
                flat = torch.cat([g.reshape(-1) for g in grads])
                ring_allreduce(comm, flat)  # a sum of means: divide by p for the global mean
                offset = 0
                for g in grads:
                    g.copy_(flat[offset : offset + g.numel()].view_as(g) / p)
                    offset += g.numel()
        elif name == "hybrid":
            with note("hybrid step"):
                hybrid_step(parts, X_own, y_own)
        elif name == "attribute":
            with note("height-split step"):
                height_split_step(parts, X_own, y_own)
        elif name == "pipeline":  # two stages: stage 0 needs every sample, stage 1 every label
            Xa = _gather_at(comm, 0, X_own, "samples", note)
            ya = _gather_at(comm, 1, y_own, "labels", note)
            start = clock.now()
            _, timeline = pipeline_step(parts, comm, PipelineSettings("naive", 1, batch), Xa, ya)
            for iv in timeline.intervals:  # seconds since pipeline_step's own barrier
                what = _PIPELINE_PHASES.get(iv.kind, iv.kind)
                clock.items.append((start + iv.start, start + iv.end, what))
        else:  # ZeRO: stages 2-3 reduce-scatter inside backward, stage 3 gathers around layers
            marks = StepTimeline()
            with note("forward"):
                loss = nn.functional.cross_entropy(net(X_own), y_own)
            with note("backward"):
                loss.backward()
            with note("reduce-scatter"):
                exchange.exchange(comm, net, marks)
        if opt is not None:
            with note("update"):
                opt.step()
        if zero:
            with note("allgather"):
                exchange.after_step(comm, net, step, marks)
            ledger = {k: v for k, v in marks.notes.items() if k.startswith("ledger_")}
        wall = clock.now()
        sent = comm.stats.bytes_sent - before[0]
        messages = comm.stats.messages_sent - before[1]
        if step:  # the first step warms up buffers and connections
            walls.append(wall)
    if zero:
        exchange.detach()  # stage 3: every unit gathered again, the whole weights on every rank
    out = {
        "walls": walls,
        "phases": sorted(clock.items),
        "bytes_sent": sent,
        "messages_sent": messages,
        "ledger": ledger,
    }
    if updates:
        out["weights"] = pieces(name, net, parts, r, cut)
    return out
