"""Lectures 4 and 11: One communication thread with a FIFO queue, so communication overlaps compute.

The training thread *submits* jobs (a bucket's allreduce, a unit's allgather or reduce-scatter)
and goes on computing; one thread runs them strictly in the order they were submitted. Every
rank submits the same collectives in the same order, so the collectives match across ranks
(PyTorch DDP runs its buckets' allreduces on a communication stream the same way, Li et al.
2020, section 3.2.3; FSDP its allgathers and reduce-scatters, Zhao et al. 2023, section 4).
While jobs may be queued, only this thread talks on the communicator.

A job's failure is handed back: :meth:`CommThread.wait` raises :class:`CommThreadError` on the
training thread, naming the rank and the job. After a failure the thread runs no further job
(the communicator's state is unknown; another collective would only time out again) and marks
each one done, so no waiter hangs.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from course_lib.comm.communicator import CommError, CommTimeoutError

__all__ = ["CommJob", "CommThread", "CommThreadError", "next_seq"]

_SEQ = itertools.count()


def next_seq() -> int:
    """Return the next number of one process-wide sequence (``next`` on a count is atomic in
    CPython): events on both threads numbered by it are ordered without reading a clock."""
    return next(_SEQ)


class CommThreadError(CommError):
    """A job on the communication thread failed; the message names the rank and the job."""


@dataclass(eq=False)
class CommJob:
    """One submitted job: ``done`` is set once it ran, failed, or was skipped after a failure.

    ``issued``, ``start``, ``end``: numbers from :func:`next_seq` (their order is the order of
    events on both threads); ``issued_at``, ``start_at``, ``end_at``: ``time.time()``.
    """

    label: str
    fn: Callable[[], None] | None  # dropped once run
    done: threading.Event = field(default_factory=threading.Event)
    issued: int = -1
    start: int = -1
    end: int = -1
    issued_at: float = 0.0
    start_at: float = 0.0
    end_at: float = 0.0


class CommThread:
    """Run submitted jobs one by one, in submission order, on a daemon thread named ``name``."""

    def __init__(self, rank: int, name: str = "comm") -> None:
        self.rank = rank
        self.error: CommThreadError | None = None  # the first failure, for the training thread
        self._queue: queue.Queue[CommJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None], label: str) -> CommJob:
        """Queue ``fn`` to run after every job submitted before it; return its job at once."""
        job = CommJob(label, fn, issued=next_seq(), issued_at=time.time())
        self._queue.put(job)
        return job

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            job.start, job.start_at = next_seq(), time.time()
            if self.error is None:
                try:
                    job.fn()
                except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                    self.error = CommThreadError(
                        f"rank {self.rank}: {job.label} failed on the communication thread: "
                        f"{type(exc).__name__}: {exc}"
                    )
                    self.error.__cause__ = exc
            job.fn = None  # its buffers go now, not when the job object does
            job.end, job.end_at = next_seq(), time.time()
            job.done.set()

    def wait(self, job: CommJob, timeout: float) -> None:
        """Wait for ``job``; raise the thread's failure, or CommTimeoutError after ``timeout`` s."""
        if not job.done.wait(timeout):
            raise CommTimeoutError(
                f"rank {self.rank}: {job.label} did not finish within {timeout:g} s; another "
                "rank stopped communicating (look at its error first)"
            )
        if self.error is not None:
            raise self.error

    def close(self, timeout: float = 5.0) -> None:
        """Let the queued jobs run, then stop the thread (wait at most ``timeout`` s for it)."""
        self._queue.put(None)
        self._thread.join(timeout)
