"""Lecture 4: Per-step accounting of data-parallel training: where each rank's time and bytes went.

On every engine a :class:`StepRecorder` hooks into the loop (a forward pre-hook, the gradient
hook, the optimiser's step hooks) and writes one plain dict per step: seconds of forward +
backward (``compute``), of waiting for the slowest rank (``wait``), of communication after
backward (``comm``) and of the optimiser (``step``); bytes sent and received point-to-point,
bytes handed to built-in collectives (``collective_bytes``: buffer bytes, not what travelled),
and ``wire_bytes``, what this rank put on the link: the point-to-point bytes sent plus each
built-in collective's wire bytes from its backend's algorithm
(:func:`course_lib.comm.wire.wire_bytes`: a gloo ring allreduce of ``S`` bytes counts
$2\frac{N-1}{N}S$, as the kit's own ring, counted message by message, sends); and the
wall-clock start and end of each phase and of each bucket's communication, for a timeline, and
``forward_end``, when the module's forward returned (the loss and backward follow), which splits
``compute`` into forward and backward on the timeline.
``wire_bytes`` is the one byte count to compare schemes by, whatever carries them.

Waiting is timed only where the method waits for every rank (the exchange's ``sync_point`` and
``synchronises_at``: every step for bulk-synchronous methods, every ``p``-th step before
Local-SGD's averaging, never for gossip). An emulated straggler
(:mod:`course_lib.parallel.data_parallel.stragglers`) sleeps right after its backward: its ``compute`` phase
is longer by ``straggler_sleep_s`` (in the record), and the others' ``wait`` shows it.
``measure_drift_every=k`` adds, after every k-th step, each replica's distance from the mean of
the replicas (``drift``): an extra allreduce of the weights, for measurement only, whose bytes
and seconds are kept out of the step's figures (its seconds are in ``drift_s``). Being a
collective, it also lines the ranks up: measure a scheme's waiting in a run without it.

Wall-clock times (``time.time()``) of different engines are comparable on one PC; across PCs
they are only as good as the PCs' clock synchronisation (NTP: about a millisecond).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from course_lib.comm.communicator import Communicator
from course_lib.comm.wire import wire_bytes
from course_lib.parallel.data_parallel.stragglers import Straggler, slow_down
from course_lib.parallel.exchanges.base import GradientExchange, StepTimeline

__all__ = ["BYTE_KEYS", "PHASES", "StepRecorder", "format_table", "summarize_steps"]

PHASES = ("compute", "wait", "comm", "step", "sync")
#: A step record's byte counts: point-to-point sent / received, buffer handed to built-in
#: collectives, and on the wire (sent + the collectives' wire bytes).
BYTE_KEYS = ("bytes_sent", "bytes_received", "collective_bytes", "wire_bytes")


class StepRecorder:
    """Time one rank's steps and count its bytes; ``records`` holds one dict per step.

    ``measure_wait``: where the exchange synchronises every rank, time a barrier first, which
    is how long this rank waits for the slowest one. Overlapped methods (buckets, DDP) skip it:
    a barrier would stop communication from overlapping backward. ``straggler``: sleep after
    each backward as this (emulated) slow rank. ``measure_drift_every``: see the module text.
    """

    def __init__(
        self,
        comm: Communicator,
        exchange: GradientExchange,
        net: nn.Module,
        measure_wait: bool = True,
        straggler: Straggler | None = None,
        measure_drift_every: int = 0,
    ) -> None:
        self.comm, self.exchange, self.net = comm, exchange, net
        self.measure_wait = measure_wait and not exchange.overlaps_backward
        self.straggler = straggler
        self.measure_drift_every = measure_drift_every
        self.records: list[dict[str, Any]] = []
        self.epoch = 0
        self._timeline = StepTimeline()
        self._t0 = 0.0
        self._forward_end = 0.0
        self._bytes = self._counters()
        self._handles: list[Any] = []

    def attach(self, module: nn.Module, optimizer: Any) -> None:
        """Register forward hooks on ``module`` and step hooks on ``optimizer``."""
        # first of the pre-hooks: stage 3 gathers the root's unit in one, and those bytes are the step's
        self._handles.append(module.register_forward_pre_hook(self._on_forward, prepend=True))
        self._handles.append(module.register_forward_hook(self._on_forward_end))
        self._handles.append(optimizer.register_step_pre_hook(self._on_step_start))
        self._handles.append(optimizer.register_step_post_hook(self._on_step_end))

    def detach(self) -> None:
        """Remove every hook this recorder registered."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def reset_counters(self) -> None:
        """Count bytes from now on (call after resetting the communicator's stats)."""
        self._bytes = self._counters()

    def _counters(self) -> tuple[float, ...]:
        stats, comm = self.comm.stats, self.comm
        collective = sum(c.bytes for c in stats.collectives.values())
        wire = wire_bytes(stats, comm.world_size, comm.backend)
        return stats.bytes_sent, stats.bytes_received, collective, wire

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        if module.training:  # evaluation passes run in eval mode and are not steps
            self._timeline = StepTimeline()
            self._t0 = time.time()
            self._forward_end = 0.0
            self._bytes = self._counters()  # traffic between steps (a checkpoint's) is not theirs

    def _on_forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        if module.training:  # backward (after the loss) starts here: the timeline splits compute
            self._forward_end = time.time()

    @property
    def current(self) -> tuple[int, dict[str, Any]]:
        """Return the step under way (from 0) and the notes its exchange has written so far."""
        return len(self.records), self._timeline.notes

    def grad_hook(self, net: nn.Module) -> None:
        """The loop's gradient hook: mark the end of backward (and any straggler's sleep), wait,
        exchange."""
        timeline = self._timeline
        timeline.mark("compute", self._t0)
        if self.straggler is not None:
            start, end = timeline.phases["compute"]
            timeline.note("straggler_sleep_s", slow_down(self.straggler, end - start))
            timeline.mark("compute", self._t0)  # the slow rank's compute, sleep included
        if self.exchange.sync_point == "exchange":
            self._wait(timeline)
        self.exchange.exchange(self.comm, net, timeline)

    def _wait(self, timeline: StepTimeline) -> None:
        """Time a barrier as ``wait`` when this step synchronises every rank."""
        step = len(self.records)
        if not (self.measure_wait and self.comm.world_size > 1):
            return
        if not self.exchange.synchronises_at(step):
            return
        start = time.time()
        before = self._counters()
        self.comm.barrier()  # returns once the slowest rank has reached this point
        timeline.mark("wait", start)
        self._bytes = tuple(  # the barrier's own (empty) message is not gradient traffic
            b + (now - was)
            for b, now, was in zip(self._bytes, self._counters(), before, strict=True)
        )

    def _on_step_start(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._step_start = time.time()

    def _on_step_end(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        timeline = self._timeline
        timeline.mark("step", self._step_start)
        step = len(self.records)
        if self.exchange.sync_point == "after_step":
            self._wait(timeline)
        self.exchange.after_step(self.comm, self.net, step, timeline)
        now = self._counters()
        sent, received, collective, wire = (a - b for a, b in zip(now, self._bytes, strict=True))
        self._bytes = now
        record: dict[str, Any] = {"rank": self.comm.rank, "epoch": self.epoch, "step": step}
        for phase in PHASES:
            start, end = timeline.phases.get(phase, (0.0, 0.0))
            record[f"{phase}_s"] = end - start
            record[f"{phase}_at"] = (start, end)
        last_end = max(end for _, end in timeline.phases.values())
        record["total_s"] = last_end - timeline.phases["compute"][0]
        record.update(bytes_sent=sent, bytes_received=received, collective_bytes=collective)
        record["wire_bytes"] = wire
        record.update(timeline.notes)
        record["buckets"] = list(timeline.buckets)
        if timeline.events:
            record["events"] = list(timeline.events)
        record["forward_end"] = self._forward_end  # 0.0: the forward was not seen
        self.records.append(record)
        if self.measure_drift_every and (step + 1) % self.measure_drift_every == 0:
            record.update(self._measure_drift())

    def _measure_drift(self) -> dict[str, float]:
        """Return this replica's L2 distance from the mean of all replicas (an extra allreduce).

        Its bytes are taken out of the counters and its seconds land in ``drift_s`` only: the
        measurement is not part of the method.
        """
        start = time.perf_counter()
        with torch.no_grad():
            mine = torch.cat([p.detach().reshape(-1).double() for p in self.net.parameters()])
        total = mine.numpy().copy()
        self.comm.allreduce(total)
        distance = float(np.linalg.norm(mine.numpy() - total / self.comm.world_size))
        self._bytes = self._counters()  # the measurement's traffic is not the method's
        return {"drift": distance, "drift_s": time.perf_counter() - start}


STATS = {"median": statistics.median, "mean": statistics.fmean}


def summarize_steps(
    records: list[dict[str, Any]], skip_first: int = 1, stat: str = "median"
) -> list[dict[str, Any]]:
    """Return one row per rank: median (or mean) seconds of each phase and of the step, bytes per step.

    The first ``skip_first`` steps (connection set-up, allocation) are left out when there are
    more steps than that. ``stat="median"`` shows a typical step; a method that communicates on
    only some steps (Local-SGD averages every ``p``-th) has a median of 0 for its communication
    and bytes: ``stat="mean"`` spreads them over all steps, so they show.
    """
    if stat not in STATS:
        raise ValueError(f"stat must be one of {sorted(STATS)}, got {stat!r}")
    average = STATS[stat]
    rows = []
    for rank in sorted({r["rank"] for r in records}):
        mine = [r for r in records if r["rank"] == rank]
        mine = mine[skip_first:] if len(mine) > skip_first else mine
        row: dict[str, Any] = {"rank": rank, "steps": len(mine)}
        for key in [f"{p}_s" for p in PHASES] + ["total_s"]:
            row[key] = average(r[key] for r in mine)
        for key in BYTE_KEYS:
            row[key] = average(r[key] for r in mine)
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """Return ``rows`` of :func:`summarize_steps` as a fixed-width text table (ms and kB).

    Bytes: point-to-point sent and received (``p2p``), buffers handed to built-in collectives
    (``handed``, not what travelled) and ``wire``, what the rank put on the link: p2p sent plus
    the built-ins' wire bytes from their backend's algorithm (:mod:`course_lib.comm.wire`).
    """
    synced = any(r["sync_s"] > 0 for r in rows)  # only methods that average weights after steps
    head = f"{'rank':>4} {'compute':>9} {'wait':>8} {'comm':>8} {'step':>8} "
    head += f"{'sync':>8} " if synced else ""
    head += f"{'total':>9} {'p2p sent':>9} {'p2p recv':>9} {'handed':>9} {'wire kB':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ms = [1e3 * r[k] for k in ("compute_s", "wait_s", "comm_s", "step_s", "sync_s", "total_s")]
        kb = [r[k] / 1e3 for k in BYTE_KEYS]
        line = f"{r['rank']:>4} {ms[0]:>7.2f}ms {ms[1]:>6.2f}ms {ms[2]:>6.2f}ms {ms[3]:>6.2f}ms "
        line += f"{ms[4]:>6.2f}ms " if synced else ""
        lines.append(line + f"{ms[5]:>7.2f}ms" + "".join(f" {v:>9.1f}" for v in kb))
    lines.append(
        "kB per step; handed: buffers given to built-in collectives; "
        "wire: p2p sent + the built-ins' bytes on the link"
    )
    return "\n".join(lines)
