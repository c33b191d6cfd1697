"""Lecture 11: ZeRO stage 3 (FSDP): weights sharded too, each module's unit gathered only while it runs.

Between steps a rank holds only its shards (weights, gradients, optimiser state: 16 Psi/N bytes
with float32 Adam). A module's unit is allgathered round the ring just before its forward and
released right after it (the parameters keep their shapes; their storage is resized to 0, as
FSDP does); a hook on the module's output gathers it again when backward reaches the module,
and once backward has produced all of the unit's gradients they are reduce-scattered (stage
2's hook) and the unit released. Each unit travels three times per step: 3(N-1)/N Psi values
per rank, half as much again as DDP, except the root's: parameters the model registers itself
(not through a submodule) stay gathered from its forward to its backward, which begins right
after, so they travel twice, as FSDP2's root does (``fully_shard``'s ``reshard_after_forward``
defaults to False for the root). The auditor counts both (:mod:`.audit`). A tied parameter is
gathered with its unit by every module that uses it (more bytes than the formula assumes).
Every allgather and reduce-scatter runs on one communication thread (``CommThread``), in the
order the training thread asks for them, the same on every rank. The ranks agree on the units'
sizes at attach, so each ring step posts its receive before the message comes ("eager").
``prefetch=True`` (the default) takes them off the critical path, as FSDP does (Zhao et al.
2023, "PyTorch FSDP", sections 3.3 and 4): the first step records the order in which the
modules run forward and backward; from then on, when a module's units are needed, the next
module's allgather is queued too (depth 1), so it travels while this module computes: one unit
more held at once (``zero3_units_held_peak``).
Reduce-scatters are queued without waiting (at most ``QUEUED_REDUCE_SCATTERS``); ``exchange``
waits for them all before the optimiser step. ``prefetch=False`` waits for every collective
where it is issued: the naive schedule, kept to compare against. ``compute_dtype`` and
``reduce_dtype``: mixed precision as FSDP2's ``MixedPrecisionPolicy`` (:mod:`.mixed`).

On one link, prefetching cannot hide a unit that holds most of the bytes: its module computes
only once its last chunk has come, so its three passes follow each other on the thread
(``bench/bench_sharded.py``). Three options shorten them. A large unit's passes can travel in
segments (``segment_bytes``, :mod:`course_lib.collectives.ring_pipelined`): the next ring
step's first segment leaves while this step's last ones travel, instead of every step waiting
for a whole chunk. ``min_unit`` is FSDP's size-based wrapping policy: modules with fewer values join the
root's unit (gathered once per step, as the root's own), so small units stop costing a
collective each, which on a shared machine waits for the slowest rank every time. ``keep_last``
keeps the last module forward runs gathered into backward, which needs it first (torchtitan
sets ``reshard_after_forward=False`` on its last block for this reason): its units travel
twice, and the in-flight peak is unchanged (backward gathers them at once anyway); from the
second step on, once the first has recorded the order.
:mod:`.unit_timeline` draws a step: each rank's compute beside its queue's collectives.

Kept whole: the hooks, the communication queue and the units' gathering and release are one
unit's life cycle and share its state; split, each half would reach into the other's.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import torch
from torch import nn

from course_lib.collectives.ring import ring_allgather
from course_lib.collectives.ring_pipelined import (
    ring_allgather_pipelined,
    ring_reduce_scatter_pipelined,
)
from course_lib.comm.buffers import as_flat_array
from course_lib.comm.communicator import Communicator
from course_lib.parallel.exchanges.base import StepTimeline
from course_lib.parallel.exchanges.bucket_choice import agree_on_layout
from course_lib.parallel.exchanges.comm_thread import CommJob, CommThread, next_seq
from course_lib.parallel.sharded.mixed import cast_inputs, check_dtypes
from course_lib.parallel.sharded.units import FlatUnit, root_unit
from course_lib.parallel.sharded.zero import Zero2

__all__ = ["QUEUED_REDUCE_SCATTERS", "SEGMENT_BYTES", "Zero3"]

#: The most reduce-scatters queued at once (each holds one unit's whole gradients).
QUEUED_REDUCE_SCATTERS = 2
#: Segments of a large unit's ring passes (4.2 MB on 4 engines, emulated Gigabit: 30 ms a pass
#: in whole chunks, 26.3 in 384 KiB-1 MiB segments, ideal 25.3; 256 KiB ones wait more often).
SEGMENT_BYTES = 1 << 19


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    """Return the first tensor in ``output`` that backward will reach (None in evaluation)."""
    items = output if isinstance(output, (tuple, list)) else [output]
    return next((t for t in items if isinstance(t, torch.Tensor) and t.requires_grad), None)


class Zero3(Zero2):
    """ZeRO stage 3: + weights sharded, gathered module by module (the FSDP unit).

    Args:
        bucket_bytes: unused by stage 3 (its units are modules), accepted like every stage's.
        prefetch: queue the next module's allgather when one is needed (overlapped), and
            reduce-scatters without waiting; False: wait for each collective where it is issued.
        compute_dtype: the dtype units are gathered and run in (None: float32; the shards,
            their gradients and the optimiser stay float32). reduce_dtype: the gradients'
            on the wire (None: ``compute_dtype``, as FSDP2's default).
        segment_bytes: a unit whose ring chunks are longer travels in segments of about this
            size, pipelined (:mod:`course_lib.collectives.ring_pipelined`: bitwise the plain
            ring's result; ``SEGMENT_BYTES`` measured best on the emulated link, nothing gained
            in the emulated room); None (the default): whole chunks, one ring step at a time, the
            messages lecture 13's simulator counts.
        min_unit: FSDP's size-based wrapping policy (``min_num_params``): a module with fewer
            trainable values of its own is no unit; its parameters join the root's unit,
            gathered once per step (0: every module with parameters is a unit).
    """

    name, stage = "zero3", 3
    cost_collective = None  # three ring passes; the cost model has no such collective

    def __init__(
        self,
        bucket_bytes: int = 1 << 16,
        prefetch: bool = True,
        compute_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        segment_bytes: int | None = None,
        min_unit: int = 0,
        keep_last: bool = False,
    ) -> None:
        super().__init__(bucket_bytes)
        for name, value in (("prefetch", prefetch), ("keep_last", keep_last)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if isinstance(min_unit, bool) or not isinstance(min_unit, int) or min_unit < 0:
            raise ValueError(f"min_unit must be a whole number of values >= 0, got {min_unit!r}")
        self.prefetch, self.min_unit, self.keep_last = prefetch, min_unit, keep_last
        self.segment_bytes = self.checked_segment_bytes(segment_bytes)
        self.compute_dtype, self.reduce_dtype = check_dtypes(compute_dtype, reduce_dtype)

    # -- set-up -------------------------------------------------------------------------------
    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Shard every unit, release the full weights, hook every module, start the thread."""
        super().attach(comm, net)
        self.handles.append(net.register_forward_pre_hook(self._new_pass))  # before its units'
        owner = {id(p): u for u in self.units for p in u.params}
        self.groups: list[list[FlatUnit]] = []  # per hooked module: the units it needs
        self.root_group = -1  # the group of the root's unit, if there is one
        root = self.units[0] if root_unit(net, 3, self.min_unit) else None
        for module in net.modules():
            mine = [owner[id(p)] for p in module.parameters(recurse=False) if id(p) in owner]
            # the root's unit is gathered by the model's own hooks and held through backward
            mine = [root] if module is net and root else [u for u in mine if u is not root]
            if units := list({u.index: u for u in mine}.values()):
                self.root_group = len(self.groups) if module is net else self.root_group
                group = len(self.groups)
                self.handles.append(module.register_forward_pre_hook(self._before(group)))
                self.handles.append(module.register_forward_hook(self._after(group)))
                self.groups.append(units)
        self.order: dict[str, list[int]] = {"forward": [], "backward": []}  # recorded in step 1
        self.cursor = {"forward": 0, "backward": 0}
        self.recording, self.in_step = True, False
        self.kept_group = -1  # keep_last: the last group forward runs (known after step 1)
        self.kept_now = False  # whether it stayed gathered into this step's backward
        self.pending: dict[int, CommJob] = {}  # unit index -> its queued allgather
        self.jobs: list[CommJob] = []  # every job queued this step
        self.scattering: deque[CommJob] = deque()  # reduce-scatters queued, oldest first
        self.scatter_peak = 0  # the most of them not yet waited for, this step
        self.events: list[dict[str, Any]] = []  # this step's, for its record
        self.held: dict[int, torch.Tensor] = {}  # the exchange's own buffers, held now
        self.held_lock = threading.Lock()
        self.held_peak = 0  # units gathered or queued at once, this step (deterministic)
        itemsize = self.compute_dtype.itemsize
        if comm.world_size > 1:  # before any receive is posted eagerly
            agree_on_layout(comm, [itemsize * u.numel for u in self.units])
        if self.compute_dtype != torch.float32:  # the shards stay float32: the master weights
            self.handles.append(net.register_forward_pre_hook(cast_inputs(self.compute_dtype)))
        self.thread = CommThread(comm.rank, "zero3-comm")
        for unit in self.units:
            unit.set_dtype(self.compute_dtype)
            unit.free()
        return net

    def wrap_optimizer(self, comm: Communicator, optimizer: torch.optim.Optimizer) -> Any:
        """Stage 2's sharded optimiser, which a checkpoint can also ask for the whole weights."""
        inner = super().wrap_optimizer(comm, optimizer)
        inner.course_whole_weights = self.whole_weights  # read by course_lib.checkpoint.state
        return inner

    def _shard_of(self, unit: FlatUnit) -> nn.Parameter:
        """This rank's chunk as a parameter of its own (the flat buffer is released between uses)."""
        return nn.Parameter(unit.flat[unit.chunk(self.comm.rank)].detach().clone())

    # -- the exchange's own buffers (counted by the ledger from both threads) -----------------
    def _hold(self, buf: torch.Tensor) -> int:
        key = next_seq()
        with self.held_lock:
            self.held[key] = buf
        return key

    def _release(self, key: int) -> None:
        with self.held_lock:
            del self.held[key]

    def _sample(self) -> None:
        with self.held_lock:
            buffers = list(self.held.values())
        self.ledger.sample(settled=False, buffers=buffers)

    # -- allgathers ---------------------------------------------------------------------------
    def _request(self, unit: FlatUnit, why: str, prefetch: bool) -> None:
        """Queue ``unit``'s allgather unless it is gathered or queued (training thread only)."""
        if unit.index in self.pending or unit.gathered:
            return
        if self.in_step:  # (a checkpoint's whole weights, between steps, are not a step's)
            self._count_held(extra=1)
        # The ring runs on a buffer of its own: a NumPy view of the flat buffer would pin its
        # storage (PyTorch then refuses to resize it), so the values are copied in afterwards.
        buf = torch.empty(unit.numel, dtype=self.compute_dtype)
        buf[unit.chunk(self.comm.rank)] = self.shards[unit.index].detach()  # (cast, as FSDP2's)
        bits = as_flat_array(buf)  # here: the communication thread then touches NumPy only
        key = self._hold(buf)

        def gather() -> None:  # on the communication thread
            if self._segmented(bits.nbytes):
                ring_allgather_pipelined(self.comm, bits, self.segment_bytes, agreed=True)
            else:
                ring_allgather(self.comm, bits, eager=True)  # sizes agreed
            with self.ledger.lock:  # the training thread may be freeing tensors meanwhile
                unit.allocate()
                with torch.no_grad():  # grad mode is per thread
                    unit.flat.copy_(buf)
                unit.gathered = True
                self._sample()  # this unit and the one in use: the in-flight peak
            self._release(key)

        job = self.thread.submit(gather, f"the allgather of unit {unit.label}")
        self.pending[unit.index] = job
        self.jobs.append(job)
        if self.in_step:
            self.events.append({"kind": "allgather", "unit": unit.index, "for": why,
                                "prefetch": prefetch, "job": job})  # fmt: skip

    def _segmented(self, nbytes: int) -> bool:
        """True when a pass over ``nbytes`` travels in segments (its chunks exceed one)."""
        return self.segment_bytes is not None and nbytes > self.comm.world_size * self.segment_bytes

    def _ring_reduce_scatter(self, flat: torch.Tensor, eager: bool) -> None:
        """Reduce-scatter ``flat``: in segments, pipelined, when its chunks exceed one."""
        if self._segmented(flat.element_size() * flat.numel()):
            ring_reduce_scatter_pipelined(self.comm, flat, segment_bytes=self.segment_bytes,
                                          agreed=True)  # fmt: skip
        else:
            super()._ring_reduce_scatter(flat, eager)

    def _count_held(self, extra: int = 0) -> None:
        """Note the most units gathered or on their way at once (only a request adds one)."""
        held = sum(1 for u in self.units if u.gathered or u.index in self.pending) + extra
        self.held_peak = max(self.held_peak, held)

    def _wait_for(self, unit: FlatUnit) -> None:
        """Return once ``unit``'s queued allgather (if any) has landed."""
        job = self.pending.pop(unit.index, None)
        if job is not None:
            self.thread.wait(job, self.comm.timeout + 30.0)

    def _need(self, group: int, why: str) -> None:
        """Gather module ``group``'s units (``why``: forward or backward); queue the next's."""
        for unit in self.groups[group]:
            self._request(unit, why, prefetch=False)
        if self.recording and self.in_step:
            self.order[why].append(group)
        elif self.prefetch:
            order, at = self.order[why], self.cursor[why]
            self.cursor[why] = at + 1
            if at + 1 < len(order) and order[at] == group:  # as recorded: prefetch the next
                for unit in self.groups[order[at + 1]]:
                    self._request(unit, why, prefetch=True)
        for unit in self.groups[group]:
            self._wait_for(unit)

    def _free(self, unit: FlatUnit) -> None:
        self._wait_for(unit)  # a queued allgather of it lands before its memory goes
        with self.ledger.lock:  # not while the communication thread reads the storages
            unit.free()

    def _gather_all(self) -> None:
        """Gather every unit whole, in float32: the master shards (in mixed precision too)."""
        if self.compute_dtype != torch.float32:
            masters = [torch.empty(unit.numel) for unit in self.units]
            for unit, buf in zip(self.units, masters, strict=True):
                buf[unit.chunk(self.comm.rank)] = self.shards[unit.index].detach()
            arrays = [buf.numpy() for buf in masters]  # the thread touches NumPy only

            def gather_masters() -> None:  # on the communication thread
                for array in arrays:
                    ring_allgather(self.comm, array)

            job = self.thread.submit(gather_masters, "the float32 master weights' allgather")
            self.thread.wait(job, self.comm.timeout + 30.0)
            for unit, buf in zip(self.units, masters, strict=True):
                unit.set_dtype(torch.float32)
                with torch.no_grad():
                    unit.flat.copy_(buf)
            return
        for unit in self.units:
            self._request(unit, "whole", prefetch=False)
        for unit in self.units:
            self._wait_for(unit)

    def whole_weights(self) -> dict[str, torch.Tensor]:
        """Return the model's whole weights by name (every rank calls it: each unit allgathered)."""
        self._gather_all()
        weights = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
        for unit in self.units:
            unit.set_dtype(self.compute_dtype)
            unit.free()
        return weights

    # -- hooks ----------------------------------------------------------------------------------
    def _new_pass(self, module: nn.Module, args: Any) -> None:
        self.cursor = {"forward": 0, "backward": 0}
        self.in_step = module.training and torch.is_grad_enabled()

    def _before(self, group: int) -> Any:
        def gather_units(module: nn.Module, args: Any) -> None:
            self._need(group, "forward")
            if self.in_step:
                self.events.append({"kind": "forward", "group": group, "start": next_seq()})

        return gather_units

    def _after(self, group: int) -> Any:
        def release_units(module: nn.Module, args: Any, output: Any) -> None:
            if self.in_step:
                self.events.append({"kind": "forward_end", "group": group, "end": next_seq()})
            out = _first_grad_tensor(output)
            keep = group == self.root_group or (group == self.kept_group and self.keep_last)
            if not keep or out is None or not self.in_step:
                for unit in self.groups[group]:  # (the root's: backward needs them next)
                    self._free(unit)
            elif group == self.kept_group:
                self.kept_now = True
            if out is not None:  # backward reaches this module: gather its weights again first
                out.register_hook(lambda grad: self._need(group, "backward"))

        return release_units

    # -- reduce-scatters ----------------------------------------------------------------------
    def _reduce_scatter(self, unit: FlatUnit) -> None:
        """Queue ``unit``'s reduce-scatter: this rank keeps its chunk of the mean (as stage 2)."""
        ready = time.time()
        # Each queued one holds a unit's whole gradients: with backward faster than the link they
        # would pile up to the whole model's. Wait for the oldest first, as FSDP's rate limiter
        # bounds what runs ahead of the communication (Zhao et al. 2023, section 4).
        while len(self.scattering) >= QUEUED_REDUCE_SCATTERS:
            self.thread.wait(self.scattering.popleft(), self.comm.timeout + 30.0)
        with self.ledger.lock:  # the gradients' storages go: not while the other thread reads
            flat = unit.flat_grads(self.reduce_dtype)  # cast to the reduce dtype (FSDP2's)
            for p in unit.params:
                p.grad = None
            key = self._hold(flat)
            self._sample()
        self.reduced += 1
        unit.reduced = True

        def reduce_scatter() -> None:  # on the communication thread
            self._scatter_into_shard(unit, flat, ready, eager=True)  # sizes agreed at attach
            self._release(key)

        job = self.thread.submit(reduce_scatter, f"the reduce-scatter of unit {unit.label}")
        self.jobs.append(job)
        self.scattering.append(job)
        self.scatter_peak = max(self.scatter_peak, len(self.scattering))
        if self.in_step:
            self.events.append({"kind": "reduce_scatter", "unit": unit.index, "job": job})
        if not self.prefetch:  # the naive schedule: every collective on the critical path
            self.thread.wait(self.scattering.pop(), self.comm.timeout + 30.0)

    def after_reduce(self, unit: FlatUnit) -> None:
        """Release the unit: backward has finished with it (all its gradients were produced)."""
        self._free(unit)

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Wait for every queued job (the reduce-scatters), then stage 2's checks."""
        start = time.time()
        for job in self.jobs:
            self.thread.wait(job, comm.timeout + 30.0)
        self.jobs, self.pending = [], {}
        self.scattering.clear()
        for unit in self.units:  # a prefetch that no module used this step (the graph changed)
            if unit.gathered:
                unit.free()  # (every job has finished: the communication thread is idle)
        if self.recording:  # the last group forward ran, other than the root's (keep_last)
            self.kept_group = next(
                (g for g in reversed(self.order["forward"]) if g != self.root_group), -1
            )
        self.recording, self.in_step = False, False
        if self.kept_now:  # its units travelled twice this step (the auditor reads it)
            timeline.note("zero3_kept_values", sum(u.numel for u in self.groups[self.kept_group]))
            self.kept_now = False
        for event in self.events:
            if (job := event.pop("job", None)) is not None:
                event.update(issued=job.issued, start=job.start, end=job.end,
                             issued_at=job.issued_at, start_at=job.start_at, end_at=job.end_at)  # fmt: skip
        timeline.events.extend(self.events)
        timeline.note("zero3_units_held_peak", self.held_peak)
        timeline.note("zero3_reduce_scatters_queued_peak", self.scatter_peak)
        self.events, self.held_peak, self.scatter_peak = [], 0, 0
        super().exchange(comm, net, timeline)
        timeline.mark("comm", start)  # the wait for the queue is this step's communication

    def detach(self) -> None:
        """Remove the hooks, gather every unit (the whole model on every rank), stop the thread."""
        super().detach()
        if getattr(self, "thread", None) is None:
            return
        try:
            if self.thread.error is None:  # after a failure the weights are not worth gathering
                self._gather_all()
        finally:
            self.thread.close()
            self.thread = None
