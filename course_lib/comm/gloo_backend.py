"""Lecture 3: The gloo backend: torch.distributed over TCP, for PCs without MPI (the Windows lab PCs)."""

from __future__ import annotations

import os
import time
import warnings
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from course_lib.comm.buffers import Buffer, chunk_bounds, like
from course_lib.comm.communicator import CommError, CommTimeoutError, Communicator

__all__ = ["GlooCommunicator", "init_gloo", "master_store"]

_REDUCIBLE = {"float16", "float32", "float64", "bfloat16", "int8", "uint8", "int32", "int64"}

# The GLOO_SOCKET_IFNAME this process set for an earlier group, so a later call without
# ``ifname`` drops it instead of silently reusing it (a value the user exported is kept).
_ifname_we_set: str | None = None


def init_gloo(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    timeout: float = 60.0,
    ifname: str | None = None,
    store: Any = None,
) -> GlooCommunicator:
    """Join the gloo process group at ``master_addr:master_port``; every rank must call it at once.

    ``ifname`` sets ``GLOO_SOCKET_IFNAME`` (e.g. ``"eth0"``): needed when ranks sit on different
    PCs and gloo would otherwise pick an interface (such as loopback) that the others cannot reach.
    ``store`` is a ``TCPStore`` that rank 0 already listens on (see :func:`master_store`);
    without it rank 0 starts one on ``master_port``. A process group that already exists on this
    process is destroyed first, so re-running a notebook cell works.
    """
    global _ifname_we_set
    if ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = _ifname_we_set = ifname
    elif _ifname_we_set and os.environ.get("GLOO_SOCKET_IFNAME") == _ifname_we_set:
        del os.environ["GLOO_SOCKET_IFNAME"]  # an earlier call's choice, not the user's setting
        _ifname_we_set = None
    if dist.is_initialized():
        dist.destroy_process_group()
    if store is None:
        store = dist.TCPStore(
            master_addr,
            int(master_port),
            world_size,
            is_master=rank == 0,
            timeout=timedelta(seconds=timeout),
            wait_for_workers=False,
        )
    # Every rank passes an explicit store (not init_method="tcp://..."), so rank 0 can use one it
    # opened before the port was announced: the port is never free between choosing and using it.
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout)
    )
    return GlooCommunicator(timeout=timeout)


def master_store(master_addr: str, world_size: int, timeout: float = 60.0) -> tuple[Any, int]:
    """Open rank 0's rendezvous store on a port the OS picks; return it and that port.

    Binding port 0 and keeping the socket open is the only race-free way to get a free port:
    a port found free and closed again can be taken by another program before gloo binds it.
    """
    store = dist.TCPStore(
        master_addr,
        0,
        world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    return store, int(store.port)


class _Broken:
    """A request that could not even be posted; waiting for it raises the original error."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def wait(self, timeout: Any = None) -> None:
        raise RuntimeError(f"connection closed: {self.exc}")


class GlooCommunicator(Communicator):
    """A communicator over a torch.distributed gloo group (default: the whole world).

    Gloo reports ``is_completed()`` only after ``wait()``, so waits use ``Work.wait(timeout)``;
    a gloo timeout closes the connection, so the group must be recreated after one. Peers are
    addressed by global rank (``dst``, not torch 2.6's ``group_dst``), and a subgroup's ranks
    follow the order given to :meth:`subgroup` however torch numbers the group (``new_group``'s
    ``sort_ranks`` is much newer still), so no recent torch keyword is needed.
    """

    backend = "gloo"

    def __init__(
        self, group: Any = None, global_ranks: list[int] | None = None, timeout: float = 60.0
    ):
        if not dist.is_initialized():
            raise RuntimeError("no gloo process group: create one with init_gloo(...) first")
        self.group = group
        self.global_ranks = global_ranks or list(range(dist.get_world_size()))
        rank = self.global_ranks.index(dist.get_rank())
        super().__init__(rank, len(self.global_ranks), timeout)
        # torch numbers a group's members in increasing global rank; row q of its allgather
        # output belongs to global rank sorted(global_ranks)[q], so reorder rows to our ranks.
        by_torch = sorted(self.global_ranks)
        self._rows = [by_torch.index(g) for g in self.global_ranks]
        self._ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

    @staticmethod
    def _tensor(arr: np.ndarray) -> torch.Tensor:
        return (
            torch.from_numpy(arr) if arr.size else torch.empty(0, dtype=torch.from_numpy(arr).dtype)
        )

    def _post_send(self, arr: np.ndarray, dst: int, raw_tag: int) -> Any:
        try:
            dst = self.global_ranks[dst]
            return dist.isend(self._tensor(arr), dst, group=self.group, tag=raw_tag)
        except RuntimeError as exc:  # a closed connection: report it when waited for
            return _Broken(exc)

    def _post_recv(self, arr: np.ndarray, src: int, raw_tag: int) -> Any:
        try:
            src = self.global_ranks[src]
            return dist.irecv(self._tensor(arr), src, group=self.group, tag=raw_tag)
        except RuntimeError as exc:
            return _Broken(exc)

    def _wait_raw(self, req: Any, deadline: float) -> bool:
        remaining = max(deadline - time.time(), 1e-3)
        try:
            req.wait(timeout=timedelta(seconds=remaining))
        except RuntimeError as exc:
            text = str(exc).lower()
            if ("timed out" in text or "timeout" in text) and "closed" not in text:
                return False
            raise CommError(f"rank {self.rank}: gloo failed: {exc}") from exc
        return True

    def reducible(self, name: str) -> bool:
        """Return True when gloo's built-in reductions accept dtype ``name``."""
        return name in _REDUCIBLE

    def _run(self, work: Any, name: str, deadline: float) -> None:
        if not self._wait_raw(work, deadline):
            raise CommTimeoutError(
                f"rank {self.rank}: gloo {name} did not finish in {self.timeout:g} s after every "
                "rank joined it; a rank may have died. Recreate the communicator."
            )

    def _builtin(self, name: str, buf: Buffer, arr: np.ndarray, deadline: float, **kw: Any) -> Any:
        t = buf.reshape(-1) if isinstance(buf, torch.Tensor) else self._tensor(arr)
        g = self.group
        with warnings.catch_warnings():  # the *_into_tensor names print deprecation warnings
            warnings.simplefilter("ignore", FutureWarning)
            if name == "all_to_all":
                return self._all_to_all(buf, t, kw["split"], deadline)
            if name == "barrier":
                self._run(dist.all_reduce(torch.zeros(1), group=g, async_op=True), name, deadline)
            elif name == "broadcast":
                work = dist.broadcast(t, self.global_ranks[kw["src"]], group=g, async_op=True)
                self._run(work, name, deadline)
            elif name == "allreduce":
                self._run(dist.all_reduce(t, self._ops[kw["op"]], g, async_op=True), name, deadline)
            elif name == "allgather":
                out = torch.empty(self.world_size * t.numel(), dtype=t.dtype)
                self._run(dist.all_gather_into_tensor(out, t, g, async_op=True), name, deadline)
                out = out.reshape((self.world_size, t.numel()))[self._rows]
                out = out.reshape((self.world_size, *buf.shape))
                return out if isinstance(buf, torch.Tensor) else out.numpy()
            elif name == "reduce_scatter":
                # Gloo gained a list reduce_scatter only after torch 2.6 (pytorch#149869), and it
                # runs one allreduce per chunk anyway; one allreduce of a copy, then this rank's
                # chunk, gives the same result on every torch version.
                full = t.clone()
                self._run(
                    dist.all_reduce(full, self._ops[kw["op"]], g, async_op=True), name, deadline
                )
                a, b = chunk_bounds(full.numel(), self.world_size)[self.rank]
                out = full[a:b].clone()
                return out if isinstance(buf, torch.Tensor) else like(buf, out.numpy())
            else:
                raise ValueError(f"unknown collective {name!r}")
        return None

    def _all_to_all(self, buf: Buffer, t: torch.Tensor, split: Any, deadline: float) -> Any:
        """gloo's ``all_to_all_single`` with blocks of any size, in this group's rank order."""
        # torch orders a group's blocks by its own member numbering: put ours in that order
        order = sorted(range(self.world_size), key=lambda i: self._rows[i])
        sent, got = split.send_bounds(), split.recv_bounds()
        src = torch.cat([t[slice(*sent[i])] for i in order]) if order else t
        out = torch.empty(split.out_shape[0] * split.width, dtype=t.dtype)
        outs = [got[i][1] - got[i][0] for i in order]
        ins = [sent[i][1] - sent[i][0] for i in order]
        work = dist.all_to_all_single(out, src, outs, ins, group=self.group, async_op=True)
        self._run(work, "all_to_all", deadline)
        pieces, start = {}, 0
        for i, size in zip(order, outs, strict=True):
            pieces[i], start = out[start : start + size], start + size
        out = torch.cat([pieces[i] for i in range(self.world_size)])
        return out if isinstance(buf, torch.Tensor) else out.numpy()

    def _split(self, ranks: list[int]) -> GlooCommunicator | None:
        members = [self.global_ranks[r] for r in ranks]
        # new_group(sort_ranks=False) exists only in recent torch; the sorted group is fine
        # because this class maps its own rank order onto torch's (see __init__).
        group = dist.new_group(ranks=members)
        if self.rank not in ranks:
            return None
        return GlooCommunicator(group, members, self.timeout)
