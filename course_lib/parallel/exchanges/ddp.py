"""Lecture 4: PyTorch DistributedDataParallel on the gloo group: what people use after the course.

DDP does what :mod:`course_lib.parallel.exchanges.buckets` does by hand (buckets in reverse order,
allreduce started from autograd hooks, overlapped with backward; Li et al. 2020), in C++.
Its allreduce finishes inside ``loss.backward()``, so :meth:`exchange` has nothing left to do.
A communication hook (``register_comm_hook``) records each bucket's interval and bytes for
the timeline and, on an emulated link, holds each bucket back for the time the link would take.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib.comm.communicator import Communicator
from course_lib.comm.emulated_link import sleep_until
from course_lib.parallel.exchanges.base import GradientExchange, StepTimeline

__all__ = ["DDPExchange"]


class DDPExchange(GradientExchange):
    """Wrap the model in ``DistributedDataParallel`` over the communicator's gloo group.

    Args:
        bucket_bytes: DDP's ``bucket_cap_mb`` in bytes (DDP's default: 25 MB).
        find_unused_parameters: DDP's own switch, needed when a step may leave a parameter
            without a gradient (a skipped branch, stochastic depth): DDP then allreduces a map
            of which parameters each rank used, every step, and leaves a parameter no rank used
            alone. Off by default, as in DDP: without it such a model fails at the next step.
    """

    name = "ddp"
    not_checkpointable_because = "PyTorch DDP wraps the model (its parameters are named module.*)"
    cost_collective = "ring_allreduce"  # overlap with backward is left out
    overlaps_backward = True

    def __init__(self, bucket_bytes: int = 25 << 20, find_unused_parameters: bool = False) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be a positive number of bytes, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        self.find_unused_parameters = bool(find_unused_parameters)
        self._records: list[dict[str, Any]] = []
        self._link_free_at = 0.0

    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Return ``net`` wrapped in DDP (which broadcasts rank 0's weights and buffers)."""
        if comm.backend != "gloo" or not dist.is_initialized():
            raise ValueError(
                "method='ddp' needs torch.distributed: use backend='gloo' "
                f"(this communicator is {comm.backend!r})"
            )
        self.comm = comm
        group = getattr(comm, "group", None)
        self.ddp = nn.parallel.DistributedDataParallel(
            net,
            process_group=group,
            bucket_cap_mb=self.bucket_bytes / 2**20,
            find_unused_parameters=self.find_unused_parameters,
        )
        self.ddp.register_comm_hook(None, self._hook)
        return self.ddp

    def _hook(self, state, bucket):  # noqa: ANN001, ANN202 - DDP rejects string annotations
        """Average one bucket like DDP's default ``allreduce_hook``, recording its interval."""
        start = time.time()
        buf = bucket.buffer()
        nbytes = buf.numel() * buf.element_size()
        buf.div_(self.comm.world_size)  # DDP divides before summing, as its default hook does
        group = getattr(self.comm, "group", None)
        fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
        record = {"index": bucket.index(), "nbytes": nbytes, "ready": start, "start": start}
        return self._then_link(fut, record, [("allreduce", nbytes)], lambda value: value[0])

    def _then_link(self, fut, record, wire, unwrap):  # noqa: ANN001, ANN202
        """Continue ``fut``: wait out the emulated link for ``wire``, record the bucket, unwrap."""

        def finished(f: torch.futures.Future) -> torch.Tensor:
            until = self._book_link(record, wire, time.time())
            if until:
                sleep_until(until)
            record["end"] = time.time()
            self._records.append(record)
            return unwrap(f.value())

        return fut.then(finished)

    def _book_link(self, record: dict[str, Any], wire: list[tuple[str, int]], now: float) -> float:
        """Book the emulated link for a bucket's collectives ``(name, nbytes)``; return when the
        bucket may finish (0.0 without a link). The record gets ``wire`` and ``link_s``.

        ``now`` is when the real collective finished: the link's time is added after it, not
        overlapped with it, because the real part is every rank arriving plus this machine's
        per-step software latency, which a real network pays on top of the wire time (the
        kit's own point-to-point algorithms pay it step by step). The link serialises buckets:
        each starts when the last one left it. ``link_s`` is the link's time for this bucket's
        collectives, ``EmulatedLink.collective_time`` summed.
        """
        record["wire"] = [(name, int(n)) for name, n in wire]
        link = self.comm.link
        if link is None:
            return 0.0
        n = self.comm.world_size
        record["link_s"] = sum(link.collective_time(name, b, n) for name, b in wire)
        begin = max(now, self._link_free_at)
        self._link_free_at = begin + record["link_s"]
        return self._link_free_at

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Nothing to send (DDP reduced during backward); move the bucket records to the timeline."""
        now = time.time()
        for record in sorted(self._records, key=lambda r: r["start"]):
            timeline.buckets.append(record)
            for name, nbytes in record.get("wire", [("allreduce", record["nbytes"])]):
                comm.stats.collective(name).add(nbytes)  # what travelled: compressed less
        self._records.clear()
        timeline.mark("comm", now)
