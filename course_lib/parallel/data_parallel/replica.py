"""Lecture 4: What runs on each engine of a data-parallel run: build the replica, sync it, train it.

The notebook side is :mod:`course_lib.parallel.data_parallel.train`; these functions are shipped to
the engines by reference (ipyparallel pickles them as ``module.name``), keep their state in the
engine's namespace under ``_course_dp``, and find the communicator there by name.
"""

from __future__ import annotations

import copy
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from course_lib.comm.communicator import Communicator
from course_lib.data.sharding import ShardSampler, shard_indices
from course_lib.parallel.data_parallel.accounting import StepRecorder
from course_lib.parallel.data_parallel.stragglers import Straggler
from course_lib.parallel.exchanges.base import GradientExchange
from course_lib.training.loop import TrainConfig, fit, make_optimizer, seed_everything
from course_lib.training.models import build_model

__all__ = [
    "GlobalBatchSampler",
    "RunSpec",
    "broadcast_parameters",
    "engine_comm_key",
    "engine_prepare",
    "engine_progress",
    "engine_train",
    "model_fingerprint",
]

STATE = "_course_dp"


class GlobalBatchSampler(ShardSampler):
    """This rank's part of every full global batch: ``B / N`` samples each, the remainder dropped.

    Global batch ``k`` of the shared permutation (``order[kB:(k+1)B]``) is split so that rank
    ``r`` takes its positions ``r, r+N, ...``: the union of the ranks' k-th batches is exactly
    the k-th batch one process would take with batch size ``B``, and every rank takes the same
    number of equal batches (so the mean of the ranks' mean gradients is the global mean).
    """

    def __init__(
        self, num_samples: int, rank: int, world_size: int, global_batch: int, *, seed: int = 0
    ) -> None:
        super().__init__(num_samples, rank, world_size, seed=seed)
        if global_batch % world_size or global_batch < world_size:
            raise ValueError(f"global batch {global_batch} does not split over {world_size} ranks")
        self.global_batch = global_batch
        self.steps = num_samples // global_batch

    def __iter__(self) -> Iterator[int]:
        order = shard_indices(
            self.num_samples, self.rank, self.world_size, seed=self.seed, epoch=self.epoch
        )
        return iter(order[: self.steps * self.global_batch // self.world_size])

    def __len__(self) -> int:
        return self.steps * self.global_batch // self.world_size


def model_fingerprint(net: nn.Module) -> list[tuple[str, tuple[int, ...], str, bool]]:
    """Return ``(name, shape, dtype, trainable)`` of every parameter and buffer, in order."""
    rows = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in net.named_parameters()]
    rows += [(n, tuple(b.shape), str(b.dtype), False) for n, b in net.named_buffers()]
    return rows


def broadcast_parameters(comm: Communicator, net: nn.Module, src: int = 0) -> None:
    """Overwrite ``net``'s parameters and buffers in place with rank ``src``'s; every rank calls it."""
    tensors = [t for t in list(net.parameters()) + list(net.buffers()) if t.numel()]
    if comm.world_size == 1 or not tensors:
        return
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
        comm.broadcast(flat, src=src)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t).to(t.dtype))
            offset += t.numel()


def _build(thing: Any, kind: type) -> Any:
    if isinstance(thing, kind):
        return copy.deepcopy(thing) if kind is nn.Module else thing
    if isinstance(thing, str) and kind is nn.Module:
        return build_model(thing)
    if callable(thing):
        return thing()
    raise TypeError(f"expected a {kind.__name__}, a function returning one, got {type(thing)}")


def engine_prepare(model: Any, dataset: Any, seed: int, comm_name: str) -> dict[str, Any]:
    """Build this rank's replica and data set; return its fingerprint for the notebook to compare.

    Each rank seeds with ``seed + rank`` on purpose: the replicas start different, so only the
    broadcast of rank 0's weights can make them equal.
    """
    from IPython import get_ipython

    ns = get_ipython().user_ns
    comm = ns[comm_name]
    seed_everything(seed + comm.rank)
    net = _build(model, nn.Module)
    data = _build(dataset, Dataset)
    ns[STATE] = {"net": net, "dataset": data, "records": []}
    return {
        "rank": comm.rank,
        "fingerprint": model_fingerprint(net),
        "num_samples": len(data),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def engine_comm_key(new: str | None = None) -> str | None:
    """Return (or, given ``new``, set) the description of the communicator set up for runs."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    if new is not None:
        ns["_course_dp_comm_key"] = new
    return ns.get("_course_dp_comm_key")


def engine_progress() -> int:
    """Return how many steps this engine completed in the current (or last) run."""
    from IPython import get_ipython

    state = get_ipython().user_ns.get(STATE) or {}
    return len(state.get("records", []))


class StepsPublished:
    """Tell the notebook how far this engine is: ``{"steps_done", "steps_total"}`` on IOPub.

    ipyparallel delivers what a running task publishes to its ``AsyncResult.data`` at once, while
    the engine is still busy (a query would wait behind the task); at most 4 messages a second.
    ``live``: values of the step just done to send along (the exchange's ``live_notes``, e.g.
    the noise scale), as ``{"step": k, note: value, ...}``; taking them costs a dict look-up.
    """

    def __init__(self, total: int) -> None:
        from ipyparallel.datapub import publish_data

        self.publish = publish_data
        self.total, self.done, self.sent = total, 0, 0.0

    def step(self, live: Callable[[], dict[str, Any]] | None = None) -> None:
        """Count one finished step; publish the count if a quarter second has passed."""
        self.done += 1
        now = time.monotonic()
        if now - self.sent >= 0.25 or self.done >= self.total:
            message: dict[str, Any] = {"steps_done": self.done, "steps_total": self.total}
            if live is not None:
                message["live"] = live()
            self.publish(message)
            self.sent = now


@dataclass(frozen=True)
class RunSpec:
    """Everything one data-parallel run tells each engine (the same on every rank).

    ``stragglers``: ``{rank: Straggler}``; a rank named there sleeps after each backward (an
    emulated slow PC). ``measure_drift_every``: record each replica's distance from the mean
    every k steps. ``checkpoint``, ``resume_from``: as in ``fit`` (rank 0 writes, every rank reads
    the same file); ``resumed_at``: that file's ``(epochs_done, steps_done)``, to number epochs.
    """

    config: TrainConfig
    exchange: GradientExchange  # each engine unpickles its own, unattached copy
    comm_name: str
    measure_wait: bool = True
    test_set: Any = None
    stragglers: dict[int, Straggler] = field(default_factory=dict)
    measure_drift_every: int = 0
    checkpoint: Any = None
    resume_from: str | None = None
    resumed_at: tuple[int, int] = (0, 0)


def engine_train(spec: RunSpec) -> dict[str, Any]:
    """Train the prepared replica as ``spec`` says, with this engine's copy of its exchange.

    Return this rank's history, step records and weights.
    """
    from IPython import get_ipython

    ns = get_ipython().user_ns
    comm, state = ns[spec.comm_name], ns[STATE]
    net, data, n = state["net"], state["dataset"], comm.world_size
    comm.stats.reset()  # the set-up's counts: the broadcast and the method's attaching
    broadcast_parameters(comm, net)  # source 000 step 3: a copy of the server's network
    config, exchange = spec.config, spec.exchange
    module = exchange.attach(comm, net)
    optimizer = exchange.wrap_optimizer(comm, make_optimizer(module, config))
    straggler = spec.stragglers.get(comm.rank)
    recorder = StepRecorder(
        comm, exchange, net, spec.measure_wait, straggler, spec.measure_drift_every
    )
    state["records"] = recorder.records
    recorder.attach(module, optimizer)
    sampler = GlobalBatchSampler(len(data), comm.rank, n, config.batch_size, seed=config.seed)
    local = replace(config, batch_size=config.batch_size // n)
    setup = comm.stats.as_rows()
    comm.stats.reset()
    recorder.reset_counters()
    done_before = (
        spec.resumed_at[0] * sampler.steps + spec.resumed_at[1]
    )  # steps of the run resumed
    progress = StepsPublished(config.num_epochs * sampler.steps - done_before)

    def grad_hook(module: nn.Module) -> None:
        # fit set the sampler to this epoch (from 0): counting steps would miscount epochs
        # whose batch a BatchRampUp has grown
        recorder.epoch = sampler.epoch + 1
        recorder.grad_hook(module)
        progress.step(live_values if exchange.live_notes else None)

    def live_values() -> dict[str, Any]:
        step, notes = recorder.current
        return {"step": step, **{k: notes[k] for k in exchange.live_notes if k in notes}}

    try:
        history = fit(
            module,
            data,
            local,
            test_set=spec.test_set,
            sampler=sampler,
            grad_hook=grad_hook,
            optimizer=optimizer,
            progress=False,
            device="cpu",
            checkpoint=spec.checkpoint,
            resume_from=spec.resume_from,
            comm=comm,
        )
    finally:
        recorder.detach()
        exchange.detach()
    weights = {name: p.detach().numpy().copy() for name, p in net.named_parameters()}
    trainable = [p for p in net.parameters() if p.requires_grad]
    return {
        "rank": comm.rank,
        "epochs": history.epochs,
        "step_times": history.step_times,
        "records": recorder.records,
        "weights": weights,
        "label": comm.label,
        "emulated": comm.emulated,
        "steps_per_epoch": sampler.steps,
        "param_bytes": int(sum(p.numel() * 4 for p in net.parameters() if p.requires_grad)),
        "flag_bytes": exchange.flag_bytes(len(trainable)),
        "max_abs_weight": float(max((np.abs(w).max() for w in weights.values()), default=0.0)),
        "counters": (setup, comm.stats.as_rows()),
    }
