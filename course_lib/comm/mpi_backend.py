"""The mpi backend: mpi4py's buffer API (uppercase Send / Recv / Allreduce) on MPI ranks."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from course_lib.comm.buffers import Buffer, chunk_bounds, like
from course_lib.comm.communicator import Communicator

__all__ = ["MPICommunicator"]

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
    """A communicator over an ``mpi4py`` communicator (default ``MPI.COMM_WORLD``).

    Waits poll the request with ``Test()`` until the deadline, so a missing peer becomes a
    ``CommTimeoutError`` naming it rather than a hang. Polling also drives MPICH's progress
    engine, which large shared-memory transfers need, so it spins for the first 20 ms and only
    then sleeps 50 us between polls (freeing the core when ranks outnumber cores).
    """

    backend = "mpi"

    def __init__(self, mpi_comm: Any = None, timeout: float = 60.0) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        super().__init__(self.mpi_comm.Get_rank(), self.mpi_comm.Get_size(), timeout)
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

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
            from course_lib.comm.communicator import CommTimeoutError

            raise CommTimeoutError(
                f"rank {self.rank}: MPI {name} did not finish in {self.timeout:g} s after every "
                "rank joined it; a rank may have died. Recreate the communicator."
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
