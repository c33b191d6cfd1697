"""The mpi backend: mpi4py's buffer API (uppercase Send / Recv / Allreduce) on MPI ranks.

Lecture 3 (communication). Each communicator owns a duplicate of the world communicator, so a
failed call leaves its unread messages behind in a context nothing else reads, and
:meth:`MPICommunicator.rebuild` (or a new communicator) starts clean (issue 20).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from course_lib.comm.buffers import Buffer, chunk_bounds, like
from course_lib.comm.communicator import CommTimeoutError, Communicator

__all__ = ["MPICommunicator"]

# Communicators replaced by ``rebuild``: kept, never freed. Freeing one would let MPICH hand its
# context id to a later duplicate, and the failed call's unread messages, still queued under that
# id, would then match the new communicator's receives: the very bug a rebuild is for (seen with
# MPICH 5.0). mpi4py (4.1) never frees a communicator on garbage collection, so one dropped by
# ``setup_communicators`` is abandoned the same way.
_ABANDONED: list[Any] = []

_REDUCIBLE = {
    "float16",
    "float32",
    "float64",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "complex64",
    "complex128",
}  # fmt: skip  -- MPICH has no MPI_SUM for bool, and NumPy (hence mpi4py) has no bfloat16


class MPICommunicator(Communicator):
    """A communicator over a private duplicate of an ``mpi4py`` communicator (default the world).

    Creating one is collective: every rank of ``mpi_comm`` must create it (the duplicate is
    agreed within ``timeout``). Its messages never meet those of ``MPI.COMM_WORLD`` used
    directly, nor those of another ``MPICommunicator``.

    Waits poll the request with ``Test()`` until the deadline, so a missing peer becomes a
    ``CommTimeoutError`` naming it rather than a hang. Polling also drives MPICH's progress
    engine, which large shared-memory transfers need, so it spins for the first 20 ms and only
    then sleeps 50 us between polls (freeing the core when ranks outnumber cores).
    """

    backend = "mpi"

    def __init__(self, mpi_comm: Any = None, timeout: float = 60.0) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self.parent = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        super().__init__(self.parent.Get_rank(), self.parent.Get_size(), timeout)
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
        self.mpi_comm = self._duplicate()

    def rebuild(self) -> None:
        """Replace the MPI communicator by a fresh duplicate; every rank must call it.

        Messages and receives that a failed call left on the old one can no longer be matched,
        so the ranks start in step again. The old one is abandoned, not freed (see ``_ABANDONED``).
        """
        fresh = self._duplicate()
        _ABANDONED.append(self.mpi_comm)
        self.mpi_comm, self._calls = fresh, 0

    def _duplicate(self) -> Any:
        """Return a new duplicate of ``parent``, agreed by every rank within ``timeout``."""
        # Idup, not Dup: a rank that never joins becomes an error here instead of a hang in C
        fresh, req = self.parent.Idup()
        if not self._wait_raw(req, time.time() + self.timeout):
            raise CommTimeoutError(
                f"rank {self.rank}: a new MPI communicator was not agreed in {self.timeout:g} s: "
                "some rank did not join (busy, stuck inside an MPI call, or dead). MPI cannot "
                "recover from this here: the world communicator now holds a collective that "
                "never finished. Run cluster.recover() (it restarts the MPI engines when their "
                "world is out of step; variables on them are lost), then "
                "setup_communicators(cluster, 'mpi') again."
            )
        return fresh

    def recovery_advice(self) -> str:
        """Return what to run after a failed call so that the ranks are in step again."""
        return (
            "Recover on every rank: setup_communicators(cluster, 'mpi') from the notebook, or "
            "comm.rebuild() on every rank (%px); the failed call's messages stay behind in the "
            "old communicator"
        )

    def _cancel(self, req: Any) -> None:
        # A cancelled receive completes at once (MPI_Cancel); one that matched in the meantime
        # completes with its 40-byte header, which is then dropped with the buffer.
        req.Cancel()
        if not self._wait_raw(req, time.time() + 1.0):
            req.Free()

    def _post_send(self, arr: np.ndarray, dst: int, raw_tag: int) -> Any:
        return self.mpi_comm.Isend(arr, dest=dst, tag=raw_tag)

    def _post_recv(self, arr: np.ndarray, src: int, raw_tag: int) -> Any:
        return self.mpi_comm.Irecv(arr, source=src, tag=raw_tag)

    def _wait_raw(self, req: Any, deadline: float) -> bool:
        spins, start = 0, time.perf_counter()
        while not req.Test():
            spins += 1
            if spins % 64 == 0:
                now = time.time()
                if now > deadline:
                    return False
                if time.perf_counter() - start > 0.02:
                    time.sleep(5e-5)  # a long wait (a barrier, a slow peer): free the core
                else:
                    os.sched_yield()  # 4 ranks on 2 cores: let the peer we wait for run
        return True

    def reducible(self, name: str) -> bool:
        """Return True when MPI's built-in reductions accept dtype ``name``."""
        return name in _REDUCIBLE

    def _wait_or_raise(self, req: Any, name: str, deadline: float) -> None:
        if not self._wait_raw(req, deadline):
            # the collective stays pending (MPI cannot cancel one): only a new duplicate helps
            raise CommTimeoutError(
                f"rank {self.rank}: MPI {name} did not finish in {self.timeout:g} s after every "
                f"rank joined it; a rank may have died (then only cluster.recover() helps). "
                f"{self.recovery_advice()}."
            )

    def _builtin(self, name: str, buf: Buffer, arr: np.ndarray, deadline: float, **kw: Any) -> Any:
        comm, MPI = self.mpi_comm, self._MPI
        if name == "barrier":
            self._wait_or_raise(comm.Ibarrier(), name, deadline)
            return None
        if name == "broadcast":
            self._wait_or_raise(comm.Ibcast(arr, root=kw["src"]), name, deadline)
            return None
        if name == "allreduce":
            req = comm.Iallreduce(MPI.IN_PLACE, arr, op=self._ops[kw["op"]])
            self._wait_or_raise(req, name, deadline)
            return None
        if name == "allgather":
            out = np.empty((self.world_size, arr.size), dtype=arr.dtype)
            self._wait_or_raise(comm.Iallgather(arr, out), name, deadline)
            return like(buf, out.reshape((self.world_size, *buf.shape)))
        if name == "all_to_all":  # Alltoallv always: MPICH's Alltoall may pick Bruck's algorithm,
            # which forwards blocks through other ranks (more bytes than the formula)
            split, width = kw["split"], kw["split"].width
            out = np.empty(split.out_shape[0] * width, dtype=arr.dtype)
            sends = [c * width for c in split.send_counts]
            recvs = [c * width for c in split.recv_counts]
            send_at = [a for a, _ in split.send_bounds()]
            recv_at = [a for a, _ in split.recv_bounds()]
            req = comm.Ialltoallv([arr, (sends, send_at)], [out, (recvs, recv_at)])
            self._wait_or_raise(req, name, deadline)
            return like(buf, out)
        if name == "reduce_scatter":
            counts = [b - a for a, b in chunk_bounds(arr.size, self.world_size)]
            out = np.empty(counts[self.rank], dtype=arr.dtype)
            req = comm.Ireduce_scatter(arr, out, counts, op=self._ops[kw["op"]])
            self._wait_or_raise(req, name, deadline)
            return like(buf, out)
        raise ValueError(f"unknown collective {name!r}")

    def _split(self, ranks: list[int]) -> MPICommunicator | None:
        member = self.rank in ranks
        color = 0 if member else self._MPI.UNDEFINED
        sub = self.mpi_comm.Split(color, ranks.index(self.rank) if member else 0)
        return MPICommunicator(sub, self.timeout) if member else None
