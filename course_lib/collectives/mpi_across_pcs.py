"""Lecture 3: Allreduce across the lab's PCs, as MPI ranks: MPI's own and the from-scratch ring, checked and timed.

Run on every rank by ``./kit lab mpi hosts.toml -- python -m course_lib.collectives.mpi_across_pcs``
(see :mod:`course_kit.lab.mpi`). Each rank fills a buffer with values that depend on its
rank; both allreduces must give the exact sum (a formula: the values are small integers, exact in
float32). Rank 0 prints one JSON line: the ranks' host names, the largest error of each method,
and the seconds of every timed repeat (the slowest rank's, as a collective ends when its last
rank does). The bound a ring cannot beat on links of ``B`` bytes/s is ``2 (N-1)/N * S / B``.
"""

from __future__ import annotations

import argparse
import json
import socket
import time

import numpy as np

from course_lib.collectives.ring import ring_allreduce
from course_lib.comm.mpi_backend import MPICommunicator

__all__ = ["expected_sum", "main", "rank_values"]


def rank_values(rank: int, n: int) -> np.ndarray:
    """Return rank ``rank``'s buffer of ``n`` float32 values: ``(i % 7) + rank``."""
    return (np.arange(n, dtype=np.int64) % 7 + rank).astype(np.float32)


def expected_sum(world_size: int, n: int) -> np.ndarray:
    """Return the exact sum of every rank's :func:`rank_values`."""
    i = np.arange(n, dtype=np.int64) % 7
    return (world_size * i + world_size * (world_size - 1) // 2).astype(np.float32)


def _timed(comm, fn, repeats: int) -> list[float]:  # noqa: ANN001
    """Return the slowest rank's seconds for each of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - start, op=_max()))
    return times


def _max():  # noqa: ANN202
    from mpi4py import MPI

    return MPI.MAX


def main(argv: list[str] | None = None) -> int:
    """Check and time MPI's Allreduce and the ring on this rank; rank 0 prints the JSON line."""
    from mpi4py import MPI

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=1.0, help="buffer size in MiB")
    parser.add_argument("--repeats", type=int, default=0, help="timed repeats of each method")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    n = int(args.mib * 2**20) // 4
    want = expected_sum(size, n)
    mine = rank_values(rank, n)
    got = np.empty_like(mine)
    world.Allreduce(mine, got, op=MPI.SUM)
    mpi_error = float(np.abs(got - want).max())
    ring_comm = MPICommunicator(world, timeout=300.0)
    ring = mine.copy()
    ring_allreduce(ring_comm, ring)
    ring_error = float(np.abs(ring - want).max())
    buf = mine.copy()
    mpi_times = _timed(world, lambda: world.Allreduce(mine, got, op=MPI.SUM), args.repeats)
    ring_times = _timed(world, lambda: ring_allreduce(ring_comm, buf), args.repeats)
    hosts = world.gather(socket.gethostname(), root=0)
    errors = world.gather(max(mpi_error, ring_error), root=0)
    if rank == 0:
        report = {
            "ranks": size,
            "hosts": hosts,
            "bytes": n * 4,
            "mpi_error": mpi_error,
            "ring_error": ring_error,
            "max_error": max(errors),
            "mpi_seconds": mpi_times,
            "ring_seconds": ring_times,
        }
        print("ALLREDUCE " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
