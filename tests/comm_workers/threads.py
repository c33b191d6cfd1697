"""An in-process communicator over threads, so hypothesis can run real collective code quickly.

Not a backend for students (the live demos use mpi or gloo processes): it exists so property
tests can try hundreds of world sizes, lengths and dtypes in one process.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np

from course_lib.comm.communicator import Communicator


class _Fabric:
    def __init__(self) -> None:
        self.queues: dict[tuple[int, int, int], queue.Queue] = defaultdict(queue.Queue)
        self.lock = threading.Lock()

    def q(self, src: int, dst: int, tag: int) -> queue.Queue:
        with self.lock:
            return self.queues[(src, dst, tag)]


class ThreadCommunicator(Communicator):
    """Rank ``rank`` of a group of threads sharing one fabric; messages are copied eagerly."""

    backend = "threads"

    def __init__(self, fabric: _Fabric, rank: int, world_size: int, timeout: float = 10.0) -> None:
        super().__init__(rank, world_size, timeout)
        self.fabric = fabric

    def _post_send(self, arr: np.ndarray, dst: int, raw_tag: int) -> Any:
        self.fabric.q(self.rank, dst, raw_tag).put(arr.tobytes())
        return None

    def _post_recv(self, arr: np.ndarray, src: int, raw_tag: int) -> Any:
        return (arr, self.fabric.q(src, self.rank, raw_tag))

    def _wait_raw(self, req: Any, deadline: float) -> bool:
        if req is None:
            return True
        arr, q = req
        try:
            data = q.get(timeout=max(deadline - time.time(), 1e-3))
        except queue.Empty:
            return False
        arr.view(np.uint8)[...] = np.frombuffer(data, dtype=np.uint8)
        return True

    def _builtin(self, name, buf, arr, deadline, **kw):
        raise NotImplementedError("the thread communicator has no built-in collectives")

    def _split(self, ranks):
        raise NotImplementedError

    def reducible(self, name: str) -> bool:
        return False


def run_threads(world_size: int, fn, timeout: float = 10.0) -> list[Any]:
    """Call ``fn(comm)`` on ``world_size`` threads; return the results ordered by rank."""
    fabric = _Fabric()
    results: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(ThreadCommunicator(fabric, rank, world_size, timeout))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    if errors:
        raise errors[0]
    return results
