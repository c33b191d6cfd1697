"""Checks of assignment A2 (ring reduce-scatter, ring allgather, ring allreduce) on real engines.

The student's function is sent to every engine and called there with the engine's
communicator (``comm``, made by :func:`course_lib.comm.setup_communicators`). Its result is
compared with the backend's own built-in allreduce on the same inputs. Inputs are small integers
stored as floats, so every summation order gives the same exact answer and verdicts are
deterministic.

The right numbers are not enough: calling the built-in collective gives them too. So the check
also reads the communicator's counters: no built-in collective may be called, and every rank must
send exactly a ring's bytes point-to-point (:func:`ring_bytes_sent`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.verdict import Verdict, run_check

__all__ = [
    "A2_POINTS",
    "A2_SIZES",
    "check_ring_allgather",
    "check_ring_allreduce",
    "check_ring_reduce_scatter",
    "ring_bytes_sent",
]

A2_POINTS = {"A2.1": 3.0, "A2.2": 2.0, "A2.3": 3.0}
A2_SIZES = (10, 1001, 4096)  # one shorter than most chunkings, one not divisible, one even


def ring_bytes_sent(kind: str, size: int, itemsize: int, rank: int, world_size: int) -> int:
    """Return the bytes ``rank`` sends in a ring ``kind`` of ``size`` elements of ``itemsize``.

    In reduce-scatter rank ``r`` sends every chunk but its own (chunk ``r`` is the one it finishes);
    in allgather every chunk but ``r + 1`` (the last one to reach it); allreduce does both.
    Chunks follow :func:`course_lib.comm.chunk_bounds`, so they differ by one element at most.
    """
    from course_lib.comm.buffers import chunk_bounds

    nbytes = [(stop - start) * itemsize for start, stop in chunk_bounds(size, world_size)]
    total = size * itemsize
    scatter = total - nbytes[rank]
    gather = total - nbytes[(rank + 1) % world_size]
    return {"reduce_scatter": scatter, "allgather": gather, "allreduce": scatter + gather}[kind]


def _run_case(fn: Callable, kind: str, size: int, dtype: str, comm_name: str) -> str:
    """Run on an engine: call the student's ``fn`` on this rank's input; return "" or what is wrong."""
    import numpy as np
    from IPython import get_ipython

    from course_lib.comm.buffers import chunk_bounds

    comm = get_ipython().user_ns[comm_name]
    rank, world_size = comm.rank, comm.world_size
    rng = np.random.default_rng([size, rank])
    x = rng.integers(-8, 9, size).astype(dtype)
    reference = comm.allreduce(x.copy())
    lo, hi = chunk_bounds(size, world_size)[rank]
    comm.stats.reset()
    if kind == "allgather":
        buf = np.zeros(size, dtype=dtype)
        buf[lo:hi] = reference[lo:hi]
        got = fn(comm, buf)
        expected, part = reference, "the gathered buffer"
    else:
        got = fn(comm, x.copy())
        expected = reference if kind == "allreduce" else reference[lo:hi]
        part = "the result" if kind == "allreduce" else f"chunk {rank} (elements {lo}:{hi})"
        if got is not None and kind == "reduce_scatter":
            got = np.asarray(got).reshape(-1)[lo:hi]
    sent = comm.stats.bytes_sent
    # A barrier moves no data, so it cannot stand in for the ring; every other built-in can.
    builtin = sorted(name for name in comm.stats.collectives if name != "barrier")
    if builtin:
        names = " and ".join(f"comm.{name}" for name in builtin)
        return f"rank {rank} uses the built-in {names}; write it from send/recv"
    if got is None:
        return f"rank {rank} returned None; return the buffer"
    got = np.asarray(got).reshape(-1)
    if got.shape != expected.shape or not np.array_equal(got, expected):
        wrong = int((got != expected).sum()) if got.shape == expected.shape else "all"
        return f"size {size}: {part} on rank {rank} is wrong ({wrong} elements differ)"
    want = ring_bytes_sent(kind, size, np.dtype(dtype).itemsize, rank, world_size)
    if sent != want:
        return (
            f"size {size}: rank {rank} sent {sent} bytes, a ring sends exactly {want} "
            f"({dtype}); is every step passing one chunk, once?"
        )
    return ""


def _check(
    exercise: str, name: str, fn: Callable, cluster: Any, kind: str, comm_name: str, verbose: bool
) -> Verdict:
    def body() -> str:
        world_size = cluster.world_size
        # The function runs on the engines; under its own name there, later answers can call it.
        cluster.view.push({fn.__name__: fn}, block=True)
        for size in A2_SIZES:
            for dtype in ("float32", "float64"):
                results = cluster.run(_run_case, fn, kind, size, dtype, comm_name, timeout=60)
                for why in results:
                    assert not why, why
        return f"{world_size} ranks, {len(A2_SIZES)} sizes, float32 and float64"

    return run_check(exercise, name, body, max_points=A2_POINTS[exercise], verbose=verbose)


def check_ring_reduce_scatter(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A2.1: ``fn(comm, x)`` returns ``x`` with chunk ``rank`` holding the sum over ranks."""
    return _check("A2.1", "ring_reduce_scatter", fn, cluster, "reduce_scatter", comm_name, verbose)


def check_ring_allgather(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A2.2: ``fn(comm, x)`` fills every chunk of ``x`` from the rank that owns it."""
    return _check("A2.2", "ring_allgather", fn, cluster, "allgather", comm_name, verbose)


def check_ring_allreduce(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A2.3: ``fn(comm, x)`` returns the sum over ranks, sending exactly a ring's bytes."""
    return _check("A2.3", "ring_allreduce", fn, cluster, "allreduce", comm_name, verbose)
