"""Lecture 5: What runs on each engine of an asynchronous run: rank 0 serves the weights, the others work.

The message protocol (every message is a Communicator message, so sizes and dtypes are checked
and every wait has a timeout naming the silent rank): a **header** of four int64
``[kind, worker, version, step]`` on tag :data:`HEADER_TAG`, then for ``PUSH`` and ``WEIGHTS``
a float32 **payload** of the trainable parameters' size on tag :data:`PAYLOAD_TAG`:

* ``WEIGHTS`` server -> worker: the weights of server ``version`` follow; compute on them.
* ``PUSH`` worker -> server: a gradient computed on ``version`` follows; it is the worker's
  ``step``-th (counting from 0).
* ``STOP`` server -> worker: the update budget is spent; nothing follows; return.

A worker loops *receive weights, compute a gradient, push it*; it never talks to another worker.
The server receives with one listening thread per worker (the Communicator has no
receive-from-any-source: a thread per peer gives "whoever comes first" on every backend) and
applies gradients one at a time in its main thread, in arrival order, through a
:class:`~course_lib.parallel.asynchronous.staleness.StalenessLedger` that also decides (stale-synchronous)
when a worker may have new weights. A worker that dies or is silent for ``worker_timeout``
seconds is dropped and reported; the others carry on.

Buffers such as batch-norm statistics are not exchanged: each rank keeps its own after the
initial copy of rank 0's (the kit's models for this lecture have none).

Kept whole: one protocol, the server and its workers read together.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DataLoader

from course_lib.comm.communicator import Communicator, wait_all
from course_lib.parallel.asynchronous.staleness import StalenessLedger
from course_lib.parallel.data_parallel.replica import (
    STATE,
    GlobalBatchSampler,
    broadcast_parameters,
)
from course_lib.parallel.data_parallel.stragglers import Straggler, slow_down
from course_lib.parallel.exchanges.base import flatten_grads, trainable_parameters
from course_lib.training.loop import TrainConfig, evaluate, make_optimizer

__all__ = ["HEADER_TAG", "PAYLOAD_TAG", "PUSH", "STOP", "WEIGHTS", "engine_async",
           "serve", "work"]  # fmt: skip

HEADER_TAG, PAYLOAD_TAG = 8140, 8141  # clear of the collectives (8100-8108) and PS_TAG (8120)
PUSH, WEIGHTS, STOP = 1, 2, 3
SERVER = 0


def _header(kind: int, worker: int, version: int, step: int) -> np.ndarray:
    return np.array([kind, worker, version, step], dtype=np.int64)


def work(
    comm: Communicator,
    net: nn.Module,
    data: Any,
    config: TrainConfig,
    straggler: Straggler | None,
    reply_timeout: float,
) -> list[dict[str, Any]]:
    """Run one worker until the server says stop; return one record per gradient pushed.

    Each record holds the wall-clock ``(start, end)`` of its phases: ``wait`` (for the server's
    reply: held back by the SSP gate, or the server busy), ``pull`` (receiving the weights),
    ``compute`` (forward + backward, stretched by a straggler) and ``push`` (sending the gradient).
    """
    workers = comm.world_size - 1
    params = trainable_parameters(net)
    weights = np.zeros(sum(p.numel() for p in params), dtype=np.float32)
    sampler = GlobalBatchSampler(
        len(data), comm.rank - 1, workers, config.batch_size, seed=config.seed
    )
    loader = DataLoader(data, batch_size=config.batch_size // workers, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss(ignore_index=255)

    def batches():
        epoch = 0
        while True:  # the server decides when to stop: cycle through the shard
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    records: list[dict[str, Any]] = []
    header = np.zeros(4, dtype=np.int64)
    stream = batches()
    net.train()
    while True:
        t_wait = time.time()
        comm.irecv(header, SERVER, HEADER_TAG).wait(reply_timeout)
        t_pull = time.time()
        if header[0] == STOP:
            break
        comm.irecv(weights, SERVER, PAYLOAD_TAG).wait(reply_timeout)
        version = int(header[2])
        t_compute = time.time()
        with torch.no_grad():
            vector_to_parameters(torch.from_numpy(weights), params)
        X, y = next(stream)
        net.zero_grad(set_to_none=True)
        loss = loss_fn(net(X), y)
        loss.backward()
        slowed = slow_down(straggler, time.time() - t_compute)
        grad = flatten_grads(params).numpy()
        t_push = time.time()
        wait_all(
            [
                comm.isend(_header(PUSH, comm.rank, version, len(records)), SERVER, HEADER_TAG),
                comm.isend(grad, SERVER, PAYLOAD_TAG),
            ],
            reply_timeout,
        )
        records.append(
            {
                "rank": comm.rank,
                "step": len(records),
                "version": version,
                "loss": loss.item(),
                "wait_at": (t_wait, t_pull),
                "pull_at": (t_pull, t_compute),
                "compute_at": (t_compute, t_push),
                "push_at": (t_push, time.time()),
                "slowed_s": slowed,
            }
        )
    return records


class _Listener:
    """One thread per worker on the server: receive its pushes, hand them to the main loop.

    After each push the thread waits until the main loop has replied, so the silence timeout
    counts only the worker's own time (pull, compute, push), never the time the gate held it.
    """

    def __init__(
        self, comm: Communicator, worker: int, size: int, inbox: queue.Queue, timeout: float
    ) -> None:
        self.comm, self.worker, self.size, self.inbox = comm, worker, size, inbox
        self.timeout = timeout
        self.replied = threading.Event()
        self.finished = False
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"listen-{worker}")

    def _run(self) -> None:
        header = np.zeros(4, dtype=np.int64)
        try:
            while True:
                self.comm.irecv(header, self.worker, HEADER_TAG).wait(self.timeout)
                if header[0] != PUSH or header[1] != self.worker:
                    raise RuntimeError(f"worker {self.worker} sent header {header.tolist()}")
                grad = np.empty(self.size, dtype=np.float32)
                self.comm.irecv(grad, self.worker, PAYLOAD_TAG).wait(self.timeout)
                self.inbox.put(("push", self.worker, header.copy(), grad, time.time()))
                self.replied.wait()
                self.replied.clear()
                if self.finished:
                    return
        except Exception as exc:  # noqa: BLE001 - any failure means: this worker is lost
            self.inbox.put(("lost", self.worker, f"{type(exc).__name__}: {exc}", None, time.time()))

    def reply(self, finished: bool = False) -> None:
        """Let the thread listen for the next push (or end, when ``finished``)."""
        self.finished = finished
        self.replied.set()


def serve(
    comm: Communicator,
    net: nn.Module,
    config: TrainConfig,
    bound: int | None,
    budget: int,
    test_set: Any,
    eval_every: int,
    worker_timeout: float,
) -> dict[str, Any]:
    """Run the server until ``budget`` gradients are applied or no worker is left; return its log."""
    params = trainable_parameters(net)
    size = sum(p.numel() for p in params)
    optimizer = make_optimizer(net, config)
    workers = list(range(1, comm.world_size))
    ledger = StalenessLedger(workers, bound)
    inbox: queue.Queue = queue.Queue()
    listeners = {w: _Listener(comm, w, size, inbox, worker_timeout) for w in workers}
    test_loader = DataLoader(test_set, batch_size=512) if test_set is not None else None
    loss_fn = nn.CrossEntropyLoss(ignore_index=255)
    lost: dict[int, str] = {}
    stopped: set[int] = set()
    history: list[dict[str, float]] = []
    applies: list[dict[str, Any]] = []
    t0 = time.time()

    def log_accuracy() -> None:
        if test_loader is not None:
            metrics = evaluate(net, test_loader, loss_fn)
            history.append(
                {
                    "updates": ledger.version,
                    "seconds": time.time() - t0,
                    "test_loss": metrics["loss"],
                    "test_accuracy": metrics["accuracy"],
                }
            )

    def send(worker: int, kind: int, flat: np.ndarray | None) -> None:
        handles = [
            comm.isend(
                _header(kind, worker, ledger.version, ledger.clocks[worker]), worker, HEADER_TAG
            )
        ]
        if flat is not None:
            handles.append(comm.isend(flat, worker, PAYLOAD_TAG))
        try:
            wait_all(handles, worker_timeout)
        except Exception as exc:  # noqa: BLE001 - the worker is gone; its listener reports it too
            lost.setdefault(worker, f"{type(exc).__name__}: {exc}")
            ledger.drop(worker)

    def reply(ready: list[int]) -> None:
        if not ready:
            return
        done = ledger.version >= budget
        flat = None if done else parameters_to_vector(params).detach().float().numpy().copy()
        for w in ready:
            if w in lost:
                continue
            send(w, STOP if done else WEIGHTS, flat)
            listeners[w].reply(finished=done)
            if done:
                stopped.add(w)
                ledger.drop(w)

    log_accuracy()
    first = parameters_to_vector(params).detach().float().numpy().copy()
    for w in ledger.start():  # the first weights; each listener starts once they are sent
        send(w, WEIGHTS, first)
        listeners[w].thread.start()
    while set(workers) - stopped - set(lost):
        try:
            kind, w, header, grad, arrived = inbox.get(timeout=2 * worker_timeout + 60)
        except queue.Empty:  # every listener has a timeout, so this is a defect, not a slow rank
            raise RuntimeError("the server heard nothing from any worker or listener") from None
        if kind == "lost":
            if w not in stopped:
                lost.setdefault(w, header)  # a lost item carries the error text there
                ledger.drop(w)
        elif ledger.version >= budget:  # pushed after the budget was spent: not applied
            ledger.drop(w)
            reply([w])
        else:
            start = time.time()
            record = ledger.arrive(w, int(header[2]))
            offset = 0
            for p in params:
                p.grad = torch.from_numpy(grad[offset : offset + p.numel()]).view_as(p).to(p.dtype)
                offset += p.numel()
            optimizer.step()
            applies.append({**asdict(record), "arrived": arrived, "apply_at": (start, time.time())})
            if ledger.version % eval_every == 0 or ledger.version == budget:
                log_accuracy()
            if ledger.version >= budget:
                reply(list(ledger.waiting))
        reply(ledger.release())
    for listener in listeners.values():  # wake any thread still parked on a reply, and end it
        listener.reply(finished=True)
        if listener.thread.is_alive():
            listener.thread.join(timeout=worker_timeout)
    # A listener still receiving would swallow the next run's first message from its worker.
    if any(listener.thread.is_alive() for listener in listeners.values()):
        raise RuntimeError("a listening thread did not end: the protocol went out of step")
    return {
        "applies": applies,
        "history": history,
        "lost": {w: _first_line(m) for w, m in lost.items()},
        "clocks": dict(ledger.clocks),
        "version": ledger.version,
        "started": t0,
        "weights": {n: p.detach().numpy().copy() for n, p in net.named_parameters()},
    }


def _first_line(text: Any) -> str:
    return str(text).strip().splitlines()[0][:400] if str(text).strip() else "no message"


def engine_async(
    config: TrainConfig,
    bound: int | None,
    budget: int,
    stragglers: dict[int, Straggler],
    comm_name: str,
    test_set: Any,
    eval_every: int,
    worker_timeout: float,
) -> dict[str, Any]:
    """Run this engine's part of an asynchronous run (rank 0 serves, the others work)."""
    from IPython import get_ipython

    ns = get_ipython().user_ns
    comm, state = ns[comm_name], ns[STATE]
    net = state["net"]
    broadcast_parameters(comm, net)  # frozen parameters and buffers start as rank 0's, too
    comm.stats.reset()
    state["records"] = []
    if comm.rank == SERVER:
        out = serve(comm, net, config, bound, budget, test_set, eval_every, worker_timeout)
    else:
        records = work(
            comm,
            net,
            state["dataset"],
            config,
            stragglers.get(comm.rank),
            reply_timeout=worker_timeout + comm.timeout,
        )
        state["records"] = records
        out = {"records": records}
    stats = comm.stats
    out.update(
        rank=comm.rank,
        label=comm.label,
        emulated=comm.emulated,
        bytes_sent=stats.bytes_sent,
        bytes_received=stats.bytes_received,
    )
    return out
