"""Checks for the exercises of lecture 3 (communication), run on real ranks.

While the student's ring runs, the library's ``ring_allgather`` refuses to
(:func:`course_lib.checks.verdict.refusing`): the lecture imports it to teach from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.checks.verdict import Verdict, refusing, reraise_stub, run_check
from course_lib.comm.buffers import chunk_bounds
from course_lib.comm.communicator import Communicator
from course_lib.i18n import N_, _

__all__ = ["REFUSED", "check_ring_allgather", "check_ring_allgather_on_rank", "stub_ring_allgather"]


REFUSED = {
    "course_lib.collectives.ring_allgather": N_("write the ring yourself with comm.sendrecv"),
}


def stub_ring_allgather(comm: Communicator, buf: np.ndarray) -> np.ndarray:
    """The released stub of Exercise 3.1."""
    raise NotImplementedError("Exercise 3.1: write ring_allgather with comm.sendrecv")


def check_ring_allgather_on_rank(comm: Communicator, fn: Callable) -> str:
    """Run ``fn(comm, buf)`` on this rank for several sizes; raise AssertionError when wrong.

    Checks the result against every rank's known input, and that this rank sent exactly the
    bytes of a ring allgather: every chunk once except the one it receives last, $(N-1)/N$ of
    the buffer, so gathering the whole buffer through another collective does not pass.
    """
    p, r = comm.world_size, comm.rank
    for size in (0, 1, p + 1, 10 * p + 3, 1000):
        want = np.arange(size, dtype=np.float32) * 0.5 + 1.0
        bounds = chunk_bounds(size, p)
        buf = np.full(size, np.nan, dtype=np.float32)
        a, b = bounds[r]
        buf[a:b] = want[a:b]
        comm.stats.reset()
        with refusing(REFUSED, fn):
            out = fn(comm, buf)
        got = buf if out is None else np.asarray(out)
        error = _problem(comm, size, got, want, bounds)
        # every rank must stop at the same size, or the others would wait in the next call
        failed = comm.allreduce(np.array([1 if error else 0], dtype=np.int64), op="max")
        if failed[0]:
            raise AssertionError(
                error or _("{size} elements: another rank's result was wrong").format(size=size)
            )
    return _("{p} ranks, sizes 0..1000, ring traffic").format(p=p)


def _problem(comm: Communicator, size: int, got, want, bounds) -> str | None:
    p, r = comm.world_size, comm.rank
    if got.shape != want.shape or not np.array_equal(got, want):
        if got.shape != want.shape:
            return _("rank {r}, {size} elements: result has shape {got}, expected {want}").format(
                r=r, size=size, got=got.shape, want=want.shape
            )
        wrong = int(np.flatnonzero(got != want)[0])
        return _("rank {r}, {size} elements: element {i} is {got}, expected {want}").format(
            r=r, size=size, i=wrong, got=got[wrong], want=want[wrong]
        )
    sent = comm.stats.bytes_sent
    expected = 4 * (size - (bounds[(r + 1) % p][1] - bounds[(r + 1) % p][0])) if p > 1 else 0
    if sent != expected:
        return _(
            "rank {r}, {size} elements: sent {sent} bytes point-to-point, a ring sends "
            "{expected} (each chunk once, to the right neighbour)"
        ).format(r=r, size=size, sent=sent, expected=expected)
    return None


def _engine_check(name: str, fn: Callable) -> str:
    from IPython import get_ipython

    from course_lib.checks.lecture03 import check_ring_allgather_on_rank

    return check_ring_allgather_on_rank(get_ipython().user_ns[name], fn)


def _engine_comm_timeout(name: str) -> float:
    from IPython import get_ipython

    comm = get_ipython().user_ns.get(name)
    if comm is None:
        raise RuntimeError(
            f"no communicator called {name!r} on this engine: run "
            f"setup_communicators(cluster, name={name!r}) first"
        )
    return float(comm.timeout)


def check_ring_allgather(
    fn: Callable,
    cluster: Any,
    *,
    comm_name: str = "comm",
    verbose: bool = True,
    timeout: float | None = None,
) -> Verdict:
    """Exercise 3.1: run the student's ``fn`` on every engine's communicator ``comm_name``.

    Prints (when ``verbose``) and returns the verdict. ``timeout`` bounds the whole run; by
    default it is the communicators' own timeout plus 15 s, so that when one rank fails the
    others' communication timeout fires first and the check reports FAIL with their errors,
    instead of the cluster giving up on the engines and restarting them.
    """

    def body() -> str:
        limit = timeout
        if limit is None:
            limit = max(cluster.run(_engine_comm_timeout, comm_name, timeout=30)) + 15.0
        try:
            details = cluster.run(_engine_check, comm_name, fn, timeout=limit)
        except Exception as exc:  # noqa: BLE001 - ipyparallel wraps the engine's exception
            inner = getattr(exc, "ename", None)
            if inner == "LibraryCall" or "LibraryCall" in str(exc):
                reraise_stub(exc)  # the refusal, as in the notebook's process
            if inner == "NotImplementedError" or "NotImplementedError" in str(exc):
                raise NotImplementedError("Exercise 3.1: write ring_allgather") from None
            if inner == "AssertionError":
                raise AssertionError(getattr(exc, "evalue", str(exc))) from None
            raise
        return details[0]

    return run_check("3.1", "ring allgather", body, verbose=verbose)
