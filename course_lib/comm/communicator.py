"""Lecture 3: The Communicator interface: point-to-point messages with headers, timeouts and counters.

Every message is a 32-byte header (element count, dtype, byte count, emulated arrival time) on
tag ``2 * tag`` followed by the payload on tag ``2 * tag + 1``. The receiver checks the header
against its buffer before the payload lands, so a size or dtype mismatch becomes an error naming
the sender instead of a hang or silent truncation; the sender posts both at once, so the header
costs one small eager message, not a round trip. Subclasses (mpi, gloo) supply raw transport.

A real communicator has no clock of its own: the header's arrival time is 0 and nothing waits
beyond the real transfer. An emulated link (:func:`course_lib.comm.emulated_link.emulate`) is a
view of a communicator that overrides the four clock hooks (``_depart``, ``_arrive``,
``_wait_for_link``, ``_after_collective``); this module knows nothing about links.

Kept whole: one interface; the header protocol, handles and counters every backend inherits.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from course_lib.comm.buffers import DTYPE_NAMES, Buffer, as_flat_array, dtype_name
from course_lib.comm.splits import row_split
from course_lib.comm.stats import CommStats

__all__ = [
    "TAG_LIMIT",
    "CommError",
    "CommMismatchError",
    "CommTimeoutError",
    "Communicator",
    "Handle",
    "wait_all",
]

TAG_LIMIT = 8192  # user tags are 0..8191; raw tags 2*tag and 2*tag+1 stay under MPI's minimum 32767
_AGREE_TAG = 2 * TAG_LIMIT + 1  # raw tag of the header exchange before a built-in collective
_REPORT_TAG = 2 * TAG_LIMIT + 3  # raw tag of the sizes swapped after a failed collective
#: Seconds a rank that saw no mismatch waits for the others' reports after a failure: theirs
#: are queued already when a rank caught one, and a rank that died must not cost a timeout more.
_GLANCE = 0.5
# Reports sent after a failure, with their buffers, never waited for: a rank that left never
# reads its report, and a send's buffer freed while MPI may still read it would send garbage.
_UNREAD_REPORTS: list[Any] = []
_COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "all_to_all")


class CommError(RuntimeError):
    """A communication call failed; the message names the ranks involved."""


class CommTimeoutError(CommError, TimeoutError):
    """A blocking call did not complete in time; the message names the rank that never answered."""


class CommMismatchError(CommError, ValueError):
    """Ranks passed buffers of different sizes or dtypes, or called different collectives."""


class Handle:
    """A pending ``isend`` / ``irecv``; ``wait()`` completes it (and returns the received buffer)."""

    def __init__(
        self, comm: Communicator, kind: str, peer: int, tag: int, buf: Buffer, eager: bool = False
    ) -> None:
        self.comm, self.kind, self.peer, self.tag, self.buf = comm, kind, peer, tag, buf
        self.arr = as_flat_array(buf)
        self.name = dtype_name(buf)
        self.t0 = time.perf_counter()
        self.done = False
        self.limit = comm.timeout  # seconds the current wait allows (for the error message)
        if kind == "send":
            self.leaves, arrives = comm._depart(self.arr.nbytes)
            header = [
                self.arr.size,
                DTYPE_NAMES.index(self.name),
                self.arr.nbytes,
                int(arrives * 1e9),
            ]
            self.header = np.array(header, dtype=np.int64)
            self.reqs = [comm._post_send(self.header, peer, 2 * tag)]
            if self.arr.size:  # an empty buffer is announced by its header alone
                self.reqs.append(comm._post_send(self.arr, peer, 2 * tag + 1))
        else:
            self.header = np.zeros(4, dtype=np.int64)
            self.reqs = [comm._post_recv(self.header, peer, 2 * tag)]
            # eager: post the payload's receive now, so the sender may start at once (gloo sends
            # only into a posted receive); only for callers that agreed on sizes beforehand.
            self.payload = (
                comm._post_recv(self.arr, peer, 2 * tag + 1) if eager and self.arr.size else None
            )

    def wait(self, timeout: float | None = None) -> Buffer | None:
        """Block until the message is complete; return the filled buffer for a receive."""
        wait_all([self], timeout)
        return self.buf if self.kind == "recv" else None

    def _complete(self, deadline: float) -> float:
        """Finish the real transfer; return when the emulated link lets it finish (0 if real)."""
        if self.kind == "send":
            for req in self.reqs:
                self._wait(req, deadline, "received")
            return self.leaves
        return self._receive(deadline)

    def _receive(self, deadline: float) -> float:
        if self.payload is not None:
            # eager (sizes agreed): wait for the payload first; its sender posted the header
            # before it, so one wake-up covers both instead of one per message
            self._wait(self.payload, deadline, "sent")
        self._wait(self.reqs[0], deadline, "sent")
        numel, code, nbytes, arrives_ns = (int(v) for v in self.header)
        sent = DTYPE_NAMES[code] if 0 <= code < len(DTYPE_NAMES) else f"dtype code {code}"
        if numel != self.arr.size or sent != self.name:
            # drain the payload so that the sender completes, then report (an eager receive
            # was posted already: its caller checked sizes, so this is the header's doing)
            if numel and self.payload is None:
                scratch = np.empty(nbytes, dtype=np.uint8)
                self._wait(
                    self.comm._post_recv(scratch, self.peer, 2 * self.tag + 1), deadline, "sent"
                )
            raise CommMismatchError(
                f"rank {self.comm.rank} expected {self.arr.size} {self.name} elements from rank "
                f"{self.peer} (tag {self.tag}) but rank {self.peer} sent {numel} {sent}: "
                "both sides must use buffers of the same size and dtype"
            )
        if numel and self.payload is None:
            payload = self.comm._post_recv(self.arr, self.peer, 2 * self.tag + 1)
            self._wait(payload, deadline, "sent")
        return self.comm._arrive(self.arr.nbytes, arrives_ns / 1e9)

    def _wait(self, req: Any, deadline: float, verb: str) -> None:
        what = "send to" if self.kind == "send" else "recv from"
        try:
            finished = self.comm._wait_raw(req, deadline)
        except CommError as exc:  # the backend lost the connection (gloo: the peer left or failed)
            raise CommError(
                f"rank {self.comm.rank}: {what} rank {self.peer} (tag {self.tag}) failed: the "
                f"connection to rank {self.peer} closed (that rank left, failed or timed out "
                f"itself). Look at rank {self.peer}'s own error first. Backend said: {exc}"
            ) from exc
        if not finished:
            raise CommTimeoutError(
                f"rank {self.comm.rank}: {what} rank {self.peer} (tag {self.tag}) timed out after "
                f"{self.limit:g} s: rank {self.peer} never answered (it {verb} nothing); "
                f"check that it calls the matching send/recv. {self.comm.recovery_advice()}."
            )

    def _count(self) -> None:
        peer = self.comm.stats.peer(self.peer)
        if self.kind == "send":
            peer.messages_sent += 1
            peer.bytes_sent += self.arr.nbytes
        else:
            peer.messages_received += 1
            peer.bytes_received += self.arr.nbytes
        peer.seconds += time.perf_counter() - self.t0


def wait_all(handles: list[Handle], timeout: float | None = None) -> None:
    """Wait for every handle: all real transfers first, then the emulated link's delay once.

    Sleeping per handle would stop this rank from driving its other transfers (MPI progresses
    only inside MPI calls), adding real time on top of the emulated time.
    """
    pending = [h for h in handles if not h.done]
    if not pending:
        return
    comm = pending[0].comm
    limit = comm.timeout if timeout is None else timeout
    deadline = time.time() + limit
    for h in pending:
        h.limit = limit
    until = max(h._complete(deadline) for h in pending)
    if until:
        comm._wait_for_link(until)
    for h in pending:
        h._count()
        h.done = True


class Communicator(ABC):
    """Engine-to-engine traffic: rank, world size, point-to-point, built-in collectives, counters.

    Blocking calls wait at most ``timeout`` seconds and then raise ``CommTimeoutError``. Buffers
    are torch tensors or NumPy arrays on the CPU and travel as raw memory, never pickled.
    """

    backend: str = "abstract"

    def __init__(self, rank: int, world_size: int, timeout: float = 60.0) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.rank, self.world_size, self.timeout = rank, world_size, float(timeout)
        self.stats = CommStats()
        self._calls = 0  # collectives started on this communicator: ranks compare it in _agree

    # ---- what a backend provides ------------------------------------------------------------
    @abstractmethod
    def _post_send(self, arr: np.ndarray, dst: int, raw_tag: int) -> Any: ...
    @abstractmethod
    def _post_recv(self, arr: np.ndarray, src: int, raw_tag: int) -> Any: ...
    @abstractmethod
    def _wait_raw(self, req: Any, deadline: float) -> bool:
        """Wait for a raw request until ``deadline`` (time.time()); return False on timeout."""

    @abstractmethod
    def _builtin(self, name: str, buf: Buffer, arr: np.ndarray, deadline: float, **kw: Any) -> Any:
        """Run the backend's own collective ``name`` on ``arr``; return its result, if any."""

    @abstractmethod
    def _split(self, ranks: list[int]) -> Communicator | None: ...
    @abstractmethod
    def reducible(self, name: str) -> bool:
        """Return True when the backend's built-in reductions accept dtype ``name``."""

    def _cancel(self, req: Any) -> None:
        """Withdraw a posted receive that timed out; by default nothing (gloo closes the link)."""
        return None

    def recovery_advice(self) -> str:
        """Return what to run after a failed call so that the ranks are in step again."""
        return (
            f"Recover: recreate the communicator on every rank, e.g. "
            f"setup_communicators(cluster, '{self.backend}') from the notebook"
        )

    # ---- the link's clock: a real link has none (an emulated link overrides these) -------------
    #: The emulated link this communicator's traffic is slowed to; None on a real link.
    link: Any = None

    def _depart(self, nbytes: int) -> tuple[float, float]:
        """Book a message of ``nbytes`` on the way out; return (when it leaves, when it arrives)."""
        return 0.0, 0.0

    def _arrive(self, nbytes: int, arrives_at: float) -> float:
        """Book a message on the way in; return when the receiver may see it (0: at once)."""
        return 0.0

    def _wait_for_link(self, until: float) -> None:
        """Hold the caller until ``until`` (``time.time()``), when the link would be done."""
        return None  # a real link is done when the transfer is

    def _after_collective(self, name: str, nbytes: int) -> None:
        """Pay the link's time for a built-in collective of ``nbytes`` (real link: nothing)."""
        return None

    # ---- labels -----------------------------------------------------------------------------
    @property
    def emulated(self) -> bool:
        """True when timings through this communicator come from an emulated link."""
        return False

    @property
    def label(self) -> str:
        """Return e.g. ``"mpi, 4 ranks, real link"`` for plots and tables."""
        return f"{self.backend}, {self.world_size} ranks, real link"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size}, {self.label}>"

    # ---- point-to-point ---------------------------------------------------------------------
    def _check_peer(self, peer: int, tag: int) -> None:
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.world_size:
            raise ValueError(
                f"rank {self.rank}: peer {peer!r} is out of range; valid peers are 0..{self.world_size - 1}"
            )
        if peer == self.rank:
            raise ValueError(f"rank {self.rank}: cannot send to or receive from itself")
        if not 0 <= tag < TAG_LIMIT:
            raise ValueError(f"tag must be in 0..{TAG_LIMIT - 1}, got {tag}")

    def isend(self, tensor: Buffer, dst: int, tag: int = 0) -> Handle:
        """Start sending ``tensor`` to ``dst``; do not modify it until ``wait()`` returns."""
        self._check_peer(dst, tag)
        return Handle(self, "send", int(dst), tag, tensor)

    def irecv(self, tensor: Buffer, src: int, tag: int = 0, *, eager: bool = False) -> Handle:
        """Start receiving into ``tensor`` (overwritten in place) from ``src``; ``wait()`` returns it.

        ``eager=True`` posts the payload's receive at once instead of after the header has
        arrived, so several receives can be in flight (pipelining); use it only where both sides
        already agreed on the buffer's size and dtype, since a mismatch is then not drained.
        """
        self._check_peer(src, tag)
        return Handle(self, "recv", int(src), tag, tensor, eager=eager)

    def send(self, tensor: Buffer, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to ``dst`` and wait until it left; ``dst`` must call ``recv``."""
        self.isend(tensor, dst, tag).wait()

    def recv(self, tensor: Buffer, src: int, tag: int = 0) -> Buffer:
        """Receive from ``src`` into ``tensor`` in place (same size and dtype as sent); return it."""
        return self.irecv(tensor, src, tag).wait()

    def sendrecv(
        self,
        send_tensor: Buffer,
        dst: int,
        recv_tensor: Buffer,
        src: int,
        tag: int = 0,
        *,
        eager: bool = False,
    ) -> Buffer:
        """Send to ``dst`` while receiving from ``src`` into ``recv_tensor``; never deadlocks a ring.

        ``eager=True`` posts the receive's payload at once (see :meth:`irecv`): for callers whose
        ranks agreed on the sizes beforehand, it saves the header's round trip on gloo.
        """
        recv = self.irecv(recv_tensor, src, tag, eager=eager)
        wait_all([recv, self.isend(send_tensor, dst, tag)])
        return recv.buf

    # ---- built-in collectives (the backend's own algorithms) ----------------------------------
    def _collective(self, name: str, buf: Buffer, code: int = 0, **kw: Any) -> Any:
        arr = as_flat_array(buf)
        deadline = time.time() + self.timeout
        t0 = time.perf_counter()
        self._agree(name, arr.size, dtype_name(buf), code, deadline)
        out = self._builtin(name, buf, arr, deadline, **kw)
        self._after_collective(name, arr.nbytes * (self.world_size if name == "allgather" else 1))
        self.stats.collective(name).add(arr.nbytes, time.perf_counter() - t0)
        return out

    def _agree(self, name: str, size: int, dname: str, code: int, deadline: float) -> None:
        """Exchange (collective, size, dtype, op/root, call number) with every rank first.

        The call number tells ranks that are out of step (one skipped a collective that timed out
        on the others) from ranks that disagree about this call. A timed-out exchange withdraws
        its receives, so they cannot swallow a later call's headers; the headers it sent stay
        unread on the silent rank until the communicator is rebuilt.
        """
        self._calls += 1
        mine = np.array(
            [_COLLECTIVES.index(name), size, DTYPE_NAMES.index(dname), code, self._calls],
            np.int64,
        )
        peers = [r for r in range(self.world_size) if r != self.rank]
        theirs = {r: np.zeros(len(mine), np.int64) for r in peers}
        recvs = {r: self._post_recv(theirs[r], r, _AGREE_TAG) for r in peers}
        sends = [self._post_send(mine, r, _AGREE_TAG) for r in peers]
        missing, broken = [], []
        for r in peers:
            try:
                if not self._wait_raw(recvs[r], deadline):
                    missing.append(r)
            except CommError:  # gloo closes a connection after a timeout on it
                broken.append(r)
        if missing or broken:
            for r in missing:
                self._cancel(recvs[r])
            parts = [f"rank(s) {missing} never called {name}"] if missing else []
            parts += [f"the connection to rank(s) {broken} is broken"] if broken else []
            why = " and ".join(parts)
            raise (CommTimeoutError if missing else CommError)(
                f"rank {self.rank}: {name} failed after {time.time() - deadline + self.timeout:.1f} s: "
                f"{why}. Every rank must call it. {self.recovery_advice()}."
            )
        for req in sends:
            self._wait_raw(req, deadline)
        out_of_step = {r: int(h[4]) for r, h in theirs.items() if h[4] != mine[4]}
        if out_of_step:
            others = ", ".join(f"rank {r} at #{n}" for r, n in sorted(out_of_step.items()))
            raise CommMismatchError(
                f"rank {self.rank} is at collective #{mine[4]} of this communicator but {others}: "
                "the ranks are out of step (a rank skipped a collective that timed out on the "
                f"others, and the communicator was not rebuilt). {self.recovery_advice()}."
            )
        bad = {r: h for r, h in theirs.items() if not np.array_equal(h, mine)}
        if bad:
            desc = lambda h: f"{_COLLECTIVES[h[0]]} of {h[1]} {DTYPE_NAMES[h[2]]} (op/root {h[3]})"  # noqa: E731
            others = "; ".join(f"rank {r} called {desc(h)}" for r, h in sorted(bad.items()))
            raise CommMismatchError(f"rank {self.rank} called {desc(mine)} but {others}")
        if name not in ("broadcast", "allgather", "barrier", "all_to_all") and not self.reducible(
            dname
        ):
            raise TypeError(f"the {self.backend} backend cannot reduce {dname}; convert to float32")

    def compare_after_failure(
        self, arr: np.ndarray, dname: str, mismatch_seen: bool
    ) -> tuple[dict[int, tuple[int, str]], list[int]]:
        """Swap this rank's buffer size and dtype with every rank after a failed collective.

        For a collective written from point-to-point messages, which every rank whose call
        failed calls in its error path: each rank talks only to some ranks (a ring: its two
        neighbours), so the rank that catches a size mismatch cannot tell whether its own size
        or its neighbour's is the odd one, and the ranks left waiting only time out. Returns
        ``({rank: (size, dtype)}, ranks that did not answer)``. Where a mismatch is known (this
        rank saw one, or a report says so) it waits up to twice the timeout, as the others
        report only once their own waits have timed out; else only a glance (``_GLANCE``).
        The reports a rank never read stay behind: rebuild the communicator after a failure.
        """
        mine = np.array([arr.size, DTYPE_NAMES.index(dname), int(mismatch_seen)], np.int64)
        peers = [r for r in range(self.world_size) if r != self.rank]
        theirs = {r: np.zeros(len(mine), np.int64) for r in peers}
        recvs = {r: self._post_recv(theirs[r], r, _REPORT_TAG) for r in peers}
        _UNREAD_REPORTS.append((mine, [self._post_send(mine, r, _REPORT_TAG) for r in peers]))
        start, answered, known = time.time(), {}, mismatch_seen
        # a second pass when a report said "mismatch" after the ones before it had been given up
        for _ in range(2):
            deadline = start + (2 * self.timeout if known else min(self.timeout, _GLANCE))
            for r in [r for r in peers if r not in answered]:
                try:
                    if self._wait_raw(recvs[r], deadline):
                        answered[r] = (int(theirs[r][0]), DTYPE_NAMES[int(theirs[r][1])])
                        known = known or bool(theirs[r][2])
                except CommError:  # a closed connection (gloo after a timeout): no report
                    answered[r] = None
            if not known or len(answered) == len(peers):
                break
        silent = [r for r in peers if answered.get(r) is None]
        for r in silent:
            if r not in answered:
                self._cancel(recvs[r])
        return {r: v for r, v in answered.items() if v is not None}, silent

    def allreduce(self, tensor: Buffer, op: str = "sum") -> Buffer:
        """Reduce ``tensor`` over all ranks in place with the backend's algorithm; every rank calls it."""
        self._collective("allreduce", tensor, _op_code(op), op=op)
        return tensor

    def broadcast(self, tensor: Buffer, src: int = 0) -> Buffer:
        """Overwrite ``tensor`` on every rank with ``src``'s copy in place; every rank calls it."""
        if not 0 <= src < self.world_size:
            raise ValueError(f"src {src} is out of range; valid ranks are 0..{self.world_size - 1}")
        self._collective("broadcast", tensor, src, src=src)
        return tensor

    def allgather(self, tensor: Buffer) -> Buffer:
        """Return a new ``(world_size, *shape)`` buffer of every rank's ``tensor``; input unchanged."""
        return self._collective("allgather", tensor)

    def reduce_scatter(self, tensor: Buffer, op: str = "sum") -> Buffer:
        """Return this rank's chunk (``chunk_bounds`` layout) of the reduced flat ``tensor``; input unchanged."""
        return self._collective("reduce_scatter", tensor, _op_code(op), op=op)

    def all_to_all(
        self,
        tensor: Buffer,
        send_counts: list[int] | None = None,
        recv_counts: list[int] | None = None,
    ) -> Buffer:
        """Send ``send_counts[j]`` rows of ``tensor`` to rank ``j``; return the rows received.

        Rows are the first dimension; block ``j`` is the ``j``-th run of rows. The result holds
        rank 0's rows for this rank first, then rank 1's, ...; the input is unchanged. Without
        counts the rows split into equal blocks (MPI's ``Alltoall``); with ``send_counts`` but no
        ``recv_counts`` the ranks first swap their counts in an all-to-all of one int64 each
        (counted too). Every rank calls it. Its counter records the bytes sent to other ranks
        (the block a rank keeps never leaves it): ``(N-1)/N`` of the buffer for equal blocks.
        """
        split = row_split(tensor, self.world_size, send_counts, recv_counts)
        if split.recv_counts is None:
            split = split.with_recv(self.all_to_all(np.asarray(split.send_counts, np.int64)))
        arr = as_flat_array(tensor)
        deadline, t0 = time.time() + self.timeout, time.perf_counter()
        # equal blocks: the ranks agree on the whole size; uneven: only on the row's width
        even = send_counts is None
        self._agree(
            "all_to_all",
            arr.size if even else split.width,
            dtype_name(tensor),
            int(not even),
            deadline,
        )
        flat = self._builtin("all_to_all", tensor, arr, deadline, split=split)
        a, b = split.send_bounds()[self.rank]
        leaving = arr.itemsize * (arr.size - (b - a))
        self._after_collective("all_to_all", leaving)
        self.stats.collective("all_to_all").add(leaving, time.perf_counter() - t0)
        return flat.reshape(split.out_shape)

    def barrier(self) -> None:
        """Wait until every rank has called ``barrier``."""
        self._collective("barrier", np.zeros(0, np.uint8))

    def subgroup(self, ranks: list[int]) -> Communicator | None:
        """Return a communicator over ``ranks`` (renumbered 0..k-1 in that order), None elsewhere.

        Every rank of this communicator must call it with the same ``ranks``.
        """
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or not all(0 <= r < self.world_size for r in ranks):
            raise ValueError(f"ranks must be distinct and in 0..{self.world_size - 1}, got {ranks}")
        return self._split(ranks)


def _op_code(op: str) -> int:
    from course_lib.comm.buffers import REDUCE_OPS

    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
    return REDUCE_OPS.index(op)
