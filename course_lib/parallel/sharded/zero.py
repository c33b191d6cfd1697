"""Lecture 11: ZeRO stages 1-3 from scratch on the kit's Communicator, as gradient-exchange methods.

Data parallelism keeps N copies of everything: weights, gradients and optimiser state. ZeRO
(Rajbhandari et al. 2020) keeps one copy, cut into N shards (:mod:`.units`):

* ``zero1``: optimiser state sharded. After backward the ring's *reduce-scatter* leaves on
  rank ``r`` the sum of chunk ``r`` of every rank's gradient (its shard of the mean, once
  divided); rank ``r`` updates only its chunk of the weights, then the ring's *allgather*
  brings every rank the updated weights. Reduce-scatter + allgather is the ring allreduce cut
  in two: DDP's bytes, 2(N-1)/N Psi values per rank.
* ``zero2``: + gradients sharded: each bucket is reduce-scattered from a post-accumulate hook
  as soon as backward has produced it, and its full-size gradients are freed.
* ``zero3``: + weights sharded (FSDP): each module's unit is allgathered just before its
  forward and again before its backward, and freed after each; 3(N-1)/N Psi values per rank
  (the root module's own parameters, kept gathered from forward to backward as FSDP2 keeps its
  root's, 2(N-1)/N of theirs).
  Its collectives run on one communication thread, the next module's allgather prefetched
  while this one computes (``Zero3(prefetch=False)``: each waited for where it is issued), a
  large unit's passes in segments; ``Zero3(min_unit=...)``: FSDP's size-based wrapping policy.
* ``zero0``: plain data parallelism (ring allreduce, every rank the whole optimiser) with the
  same memory ledger, the baseline of the comparison.

Each rank's optimiser is the model's own (Adam, AdamW, SGD with momentum) built over its
shards: those updates are elementwise, so a shard's update is bitwise the update one process
makes to those values given the same gradient. Every stage is checkpointable: the whole weights
and every rank's shards (:mod:`course_lib.checkpoint.state`), resumed on the same stage and N.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, ClassVar

import torch
from torch import nn

from course_lib.collectives.ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from course_lib.collectives.ring_pipelined import DEFAULT_SEGMENT_BYTES, ring_allreduce_pipelined
from course_lib.comm.communicator import Communicator
from course_lib.parallel.exchanges.base import GradientExchange, StepTimeline, trainable_parameters
from course_lib.parallel.sharded.ledger import Ledger
from course_lib.parallel.sharded.units import FlatUnit, plan_units

__all__ = ["Zero0", "Zero1", "Zero2", "ZeroExchange", "shard_optimizer"]

SHARDABLE = ("Adam", "AdamW", "SGD")


def shard_optimizer(
    optimizer: torch.optim.Optimizer, shards: list[nn.Parameter]
) -> torch.optim.Optimizer:
    """Return an optimiser of ``optimizer``'s class and settings over ``shards`` instead."""
    cls = type(optimizer)
    if cls.__name__ not in SHARDABLE or len(optimizer.param_groups) != 1:
        raise ValueError(
            f"ZeRO shards elementwise optimisers with one parameter group ({', '.join(SHARDABLE)}); "
            f"got {cls.__name__} with {len(optimizer.param_groups)} groups: use "
            "TrainConfig(optimizer='adam' or 'sgd')"
        )
    group = optimizer.param_groups[0]
    # only what the constructor takes: AdamW's defaults carry Adam's ``decoupled_weight_decay``,
    # which AdamW's constructor refuses
    accepted = inspect.signature(cls.__init__).parameters
    return cls(shards, **{k: group[k] for k in optimizer.defaults if k in group and k in accepted})


class ZeroExchange(GradientExchange):
    """ZeRO at ``stage`` (a class fact); ``bucket_bytes``: stage 2's bucket size."""

    stage: ClassVar[int] = 0
    name = "zero0"
    # After every step each rank holds its shard of the optimiser state and (stages 0-2) the whole
    # weights; a checkpoint keeps the whole weights and every rank's shard (stage 3: the weight
    # shards too, the whole weights gathered for the file).
    checkpointable = True
    cost_collective = "ring_allreduce"  # reduce-scatter + allgather: the ring allreduce's bytes
    min_unit = 0  # stage 3's wrapping policy (:func:`~.units.plan_units`)
    segment_bytes: int | None = None  # stage 0: None, the plain ring; else pipelined segments

    @staticmethod
    def checked_segment_bytes(segment_bytes: int | None) -> int | None:
        """Return ``segment_bytes`` (None: whole chunks), or raise naming the allowed values."""
        if segment_bytes is not None and (isinstance(segment_bytes, bool) or segment_bytes < 1):
            raise ValueError(f"segment_bytes must be None or >= 1, got {segment_bytes!r}")
        return segment_bytes

    def __init__(self, bucket_bytes: int = 1 << 16) -> None:
        if int(bucket_bytes) < 4:
            raise ValueError(f"bucket_bytes must be at least one float32 (4), got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)

    # -- set-up -------------------------------------------------------------------------------
    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Flatten ``net``'s units, take this rank's shards, register the stage's hooks."""
        self.comm, self.net, self.handles = comm, net, []
        self.params = trainable_parameters(net)
        self.units: list[FlatUnit] = plan_units(
            net, self.stage, comm.world_size, self.bucket_bytes, self.min_unit
        )
        for unit in self.units:
            unit.flatten_parameters()
        self.shards = [self._shard_of(u) for u in self.units] if self.stage else []
        self.ledger = Ledger(self.params, self.shards)
        self.handles.extend(self.ledger.watch_forward(net))  # activations, counted as saved
        self.bucket_records: list[dict[str, Any]] = []
        self.reduced = 0
        return net

    def _shard_of(self, unit: FlatUnit) -> nn.Parameter:
        """This rank's chunk of ``unit`` as a parameter: a view of the flat buffer (stages 1-2)."""
        return nn.Parameter(unit.flat[unit.chunk(self.comm.rank)].detach())

    def wrap_optimizer(self, comm: Communicator, optimizer: torch.optim.Optimizer) -> Any:
        """Return the model's optimiser rebuilt over this rank's shards (stage 0: unchanged)."""
        inner = shard_optimizer(optimizer, self.shards) if self.stage else optimizer
        inner.course_shards = self.optimizer_shards(comm.world_size)  # read by checkpoints
        self.ledger.optimizer = inner
        return inner

    def optimizer_shards(self, world_size: int) -> dict[str, int] | None:
        """Return ``{"stage", "world_size"}`` for stages 1-3 (their state is cut in shards)."""
        return {"stage": self.stage, "world_size": world_size} if self.stage else None

    def detach(self) -> None:
        """Remove the hooks."""
        for handle in getattr(self, "handles", []):
            handle.remove()
        self.handles = []

    # -- the step -----------------------------------------------------------------------------
    def _check_gradients(self) -> None:
        """Raise naming the fix when a trainable parameter took no part in this step."""
        missing = [
            n
            for u in self.units
            if not u.reduced
            for n, p in zip(u.names, u.params, strict=True)
            if p.grad is None
        ]
        if missing:
            raise ValueError(
                f"parameter {missing[0]!r} got no gradient this step: ZeRO updates flat shards and "
                "cannot leave one parameter alone; freeze it (requires_grad=False) or use "
                "method='ring'"
            )

    def _reduce_scatter(self, unit: FlatUnit) -> None:
        """Reduce-scatter ``unit``'s gradients: keep this rank's chunk of the mean, free the rest."""
        ready = time.time()
        flat = unit.flat_grads()
        for p in unit.params:
            p.grad = None
        self.ledger.sample(settled=False, buffers=[flat])  # the exchange's own buffer
        self._scatter_into_shard(unit, flat, ready)
        self.reduced += 1
        unit.reduced = True

    def _scatter_into_shard(
        self, unit: FlatUnit, flat: torch.Tensor, ready: float, eager: bool = False
    ) -> None:
        """Reduce-scatter ``flat`` (``unit``'s whole gradients) round the ring; this rank's chunk
        of the mean becomes its shard's gradient; note the bucket's times (ready: since ``ready``).
        ``eager``: the ranks agreed on the sizes, so receives are posted before messages come."""
        start = time.time()
        self._ring_reduce_scatter(flat, eager)  # (stage 3: in its reduce dtype)
        mean = flat[unit.chunk(self.comm.rank)] / self.comm.world_size
        self.shards[unit.index].grad = mean.float()  # the float32 shard's float32 gradient
        self.bucket_records.append(
            {
                "index": unit.index,
                "nbytes": flat.element_size() * unit.numel,
                "ready": ready,
                "start": start,
                "end": time.time(),
            }
        )

    def _ring_reduce_scatter(self, flat: torch.Tensor, eager: bool) -> None:
        """Reduce-scatter ``flat`` round the ring (stage 3: in segments, when it is large)."""
        ring_reduce_scatter(self.comm, flat, eager=eager)

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Stage 0: allreduce; stage 1: reduce-scatter the whole gradient (2-3 did it in backward)."""
        start = time.time()
        if self.stage <= 1:
            self._check_gradients()
            self.ledger.sample(settled=True)  # full gradients held: the peak of stages 0-1
            unit = self.units[0]
            if self.stage == 0:
                flat = unit.flat_grads()
                self.ledger.sample(settled=False, buffers=[flat])
                if self.segment_bytes is None:
                    ring_allreduce(comm, flat.numpy())
                else:  # bitwise the plain ring's sums; every rank flattened the same model
                    ring_allreduce_pipelined(
                        comm, flat.numpy(), segment_bytes=self.segment_bytes, agreed=True
                    )
                flat /= comm.world_size
                for p, part in zip(
                    unit.params, flat.split([p.numel() for p in unit.params]), strict=True
                ):
                    p.grad = part.view_as(p).clone()
            else:
                self._reduce_scatter(unit)
        elif self.reduced != len(self.units):
            self._check_gradients()
            raise RuntimeError(f"only {self.reduced} of {len(self.units)} units were reduced")
        else:
            self.ledger.sample(settled=True)
        self.reduced = 0
        for unit in self.units:
            unit.reduced = False
        timeline.buckets.extend(self.bucket_records)
        self.bucket_records = []
        timeline.mark("comm", start)

    def after_step(
        self, comm: Communicator, net: nn.Module, step: int, timeline: StepTimeline
    ) -> None:
        """Allgather the updated weights (stages 1-2); note the step's ledger in its record."""
        self.ledger.sample(settled=True)
        if self.stage in (1, 2):
            start = time.time()
            for unit in self.units:
                ring_allgather(comm, unit.flat_numpy())
            timeline.mark("sync", start)
        for shard in self.shards:  # the shard's gradient is spent: free it, as zero_grad would
            shard.grad = None
        for key, value in self.ledger.close().items():
            timeline.note(key, value)


class Zero0(ZeroExchange):
    """Plain data parallelism on the ring, with the ledger: the baseline ZeRO is measured against.

    ``segment_bytes`` (default 1 MiB): ring chunks larger than this travel in segments, pipelined
    (bitwise the plain ring; in the emulated room, 4 PCs, 4.5 MB of gradients: 1.11x DDP's step
    against 1.31x in whole chunks, ``bench/bench_sharded.py --room``); None: whole chunks.
    """

    name, stage = "zero0", 0

    def __init__(
        self, bucket_bytes: int = 1 << 16, segment_bytes: int | None = DEFAULT_SEGMENT_BYTES
    ) -> None:
        super().__init__(bucket_bytes)
        self.segment_bytes = self.checked_segment_bytes(segment_bytes)


class Zero1(ZeroExchange):
    """ZeRO stage 1: optimiser state sharded (reduce-scatter, shard update, allgather)."""

    name, stage = "zero1", 1


class Zero2(ZeroExchange):
    """ZeRO stage 2: + gradients reduce-scattered bucket by bucket during backward, then freed."""

    name, stage = "zero2", 2
    overlaps_backward = True

    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Set up the units and a post-accumulate hook on every trainable parameter."""
        super().attach(comm, net)
        for unit in self.units:
            for p in unit.params:
                self.handles.append(p.register_post_accumulate_grad_hook(self._hook(unit)))
        return net

    def _hook(self, unit: FlatUnit) -> Any:
        def on_gradient(param: nn.Parameter) -> None:
            unit.ready += 1
            self.ledger.sample(settled=False)
            if unit.ready == len(unit.params):  # the bucket is complete: send it now
                unit.ready = 0
                self._reduce_scatter(unit)
                self.after_reduce(unit)

        return on_gradient

    def after_reduce(self, unit: FlatUnit) -> None:
        """Run after ``unit``'s gradients were reduce-scattered (stage 3 frees its weights)."""
