"""Lecture 3: The ring allreduce with each chunk cut into segments, so the link never waits for arithmetic.

:func:`~course_lib.collectives.ring.ring_allreduce` moves a whole chunk per step, then adds it:
while it adds, its link is idle, and the next step starts only when the whole chunk has landed.
Here every chunk travels as segments (about ``segment_bytes`` each). A segment is reduced as soon
as it arrives, and, because the chunk a rank sends in step ``k + 1`` is the one it received in
step ``k``, forwarded to the right neighbour at once, while the later segments of step ``k`` are
still in flight. This is the pipelining of Patarasuk & Yuan (2009) and of the segmented rings in
NCCL and gloo: the sends of consecutive steps overlap, and only one segment's arithmetic is left
on the critical path. The result is bitwise the same as the plain ring (same chunks, same owners,
same order of additions). Each half alone, ZeRO stage 3's passes, runs the same way
(:func:`ring_reduce_scatter_pipelined`, :func:`ring_allgather_pipelined`).

Receives are posted one step ahead: the moment segment ``j`` of step ``k`` has been used, the
receive for segment ``j`` of step ``k + 1`` is posted into the scratch slot (or chunk) it frees.
Gloo sends only into a posted receive, and a "ready to receive" notice queues behind this rank's
own outgoing data (a few ms on a shaped link), so a receive posted only when its step begins
leaves the left neighbour's link idle at every step boundary; posted a step early, the notice
has long arrived when the data is ready. Measured in the emulated room (``bench/bench_room.py``).
"""

from __future__ import annotations

import time

import numpy as np

from course_lib.collectives.common import reduce_into, reducible_flat
from course_lib.collectives.ring import ring_allreduce, ring_schedule
from course_lib.comm.buffers import Buffer, as_flat_array, chunk_bounds, dtype_name
from course_lib.comm.communicator import CommMismatchError, Communicator, Handle, wait_all

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "SEGMENT_TAGS",
    "ring_allgather_pipelined",
    "ring_allreduce_in_segments",
    "ring_allreduce_pipelined",
    "ring_reduce_scatter_pipelined",
    "segment_bounds",
    "segment_count",
]

# One tag per segment index, so segments in flight between the same two ranks cannot swap:
# reduce-scatter segments use 8120 + j, allgather segments 8156 + j (j < MAX_SEGMENTS). Steps of
# one phase reuse a tag; messages of one tag and pair arrive in order (gloo, MPI), and the receive
# for step k + 1 is posted only after step k's has completed.
SEGMENT_TAGS = {"ring_rs": 8120, "ring_ag": 8156}
AGREE_TAG = 8119  # the neighbours compare buffer sizes before any eager receive is posted
MAX_SEGMENTS = 36
DEFAULT_SEGMENT_BYTES = 1 << 20  # 1 MiB: long enough to fill the link, short enough to pipeline


def segment_bounds(start: int, stop: int, segments: int) -> list[tuple[int, int]]:
    """Cut ``[start, stop)`` into ``segments`` contiguous pieces whose lengths differ by <= 1."""
    return [(start + a, start + b) for a, b in chunk_bounds(stop - start, segments)]


def segment_count(size: int, itemsize: int, world_size: int, segment_bytes: int) -> int:
    """Return the segments each ring chunk of a ``size``-element buffer travels in (1: whole)."""
    longest = -(-size // max(world_size, 1))  # chunk_bounds gives the first chunks one more
    return int(min(MAX_SEGMENTS, max(1, np.ceil(longest * itemsize / segment_bytes))))


def ring_allreduce_pipelined(
    comm: Communicator,
    tensor: Buffer,
    op: str = "sum",
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    timeline: list[tuple[int, int, float]] | None = None,
    *,
    agreed: bool = False,
) -> Buffer:
    """Reduce ``tensor`` over all ranks in place, as the ring does, with segments pipelined.

    Every rank calls it with a buffer of the same size and dtype (and the same ``segment_bytes``)
    and ends with results bitwise equal to :func:`~course_lib.collectives.ring_allreduce`'s.
    Cost: $2(N-1)(\\alpha + \\frac{n}{N}\\beta)$ with the reductions hidden behind the transfers.
    ``timeline``, if given, gets ``(step, segment, time.perf_counter())`` as each segment lands
    (step -1: the entry, -2: the size check done, ``2(N-1)``: the return), to show where time goes.
    ``agreed``: as in :func:`ring_reduce_scatter_pipelined` (no size check round the ring).
    """
    return _pipelined(comm, tensor, op, segment_bytes, "both", agreed, timeline)


def ring_allreduce_in_segments(
    comm: Communicator, arr: np.ndarray, segment_bytes: int | None, *, agreed: bool = False
) -> None:
    """Sum ``arr`` in place round the ring: pipelined where its chunks exceed ``segment_bytes``,
    in whole chunks otherwise or with None (bitwise the same sums either way).

    ``agreed``: every rank's buffer is known to have this size (no check round the ring).
    """
    n = comm.world_size
    if segment_bytes is not None and segment_count(arr.size, arr.itemsize, n, segment_bytes) > 1:
        ring_allreduce_pipelined(comm, arr, segment_bytes=segment_bytes, agreed=agreed)
    else:
        ring_allreduce(comm, arr, eager=agreed)


def ring_reduce_scatter_pipelined(
    comm: Communicator,
    tensor: Buffer,
    op: str = "sum",
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    *,
    agreed: bool = False,
) -> Buffer:
    """The ring's reduce-scatter (:func:`~course_lib.collectives.ring.ring_reduce_scatter`) with
    segments pipelined: chunk ``rank`` ends bitwise as the plain ring leaves it. A bfloat16
    tensor is added as torch adds bfloat16. ``agreed``: the ranks agreed on the size already
    (no check round the ring first)."""
    return _pipelined(comm, tensor, op, segment_bytes, "reduce-scatter", agreed)


def ring_allgather_pipelined(
    comm: Communicator,
    tensor: Buffer,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    *,
    agreed: bool = False,
) -> Buffer:
    """The ring's allgather (:func:`~course_lib.collectives.ring.ring_allgather`) with segments
    pipelined: every chunk filled from its owner. ``agreed``: as in the reduce-scatter."""
    return _pipelined(comm, tensor, "sum", segment_bytes, "allgather", agreed)


def _pipelined(
    comm: Communicator,
    tensor: Buffer,
    op: str,
    segment_bytes: int,
    phases: str,
    agreed: bool,
    timeline: list[tuple[int, int, float]] | None = None,
) -> Buffer:
    """Run the ring's ``phases`` ("both", "reduce-scatter" or "allgather") with segments."""
    if segment_bytes < 1:
        raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
    mark = timeline.append if timeline is not None else None
    if mark:
        mark((-1, 0, time.perf_counter()))
    bf16 = not isinstance(tensor, np.ndarray) and dtype_name(tensor) == "bfloat16"
    arr = (
        reducible_flat(tensor, op, bfloat16_ok=bf16)
        if phases != "allgather"
        else as_flat_array(tensor)
    )
    p, r = comm.world_size, comm.rank
    if p == 1 or arr.size == 0:
        return tensor
    bounds = chunk_bounds(arr.size, p)
    longest = bounds[0][1] - bounds[0][0]
    segments = segment_count(arr.size, arr.itemsize, p, segment_bytes)
    right, left = (r + 1) % p, (r - 1) % p
    if not agreed:
        _agree_with_neighbours(comm, arr, right, left)
    if mark:
        mark((-2, 0, time.perf_counter()))
    schedule = ring_schedule(r, p)
    if phases != "both":
        schedule = schedule[: p - 1] if phases == "reduce-scatter" else schedule[p - 1 :]
    pieces = {c: segment_bounds(*bounds[c], segments) for c in range(p)}
    slot = -(-longest // segments)  # scratch slot j holds segment j of any chunk (all fit)
    scratch = np.empty(slot * segments if phases != "allgather" else 0, dtype=arr.dtype)
    sending: dict[tuple[int, int], Handle] = {}  # (chunk, segment) -> the send still reading it

    def send(k: int, j: int) -> None:
        phase, chunk, _ = schedule[k]
        a, b = pieces[chunk][j]
        tag = SEGMENT_TAGS[_tag_phase(phase)] + j
        sending[(chunk, j)] = comm.isend(arr[a:b], right, tag)

    def post_receive(k: int, j: int) -> Handle:
        phase, _, got = schedule[k]
        a, b = pieces[got][j]
        if phase == "reduce-scatter":
            target = scratch[j * slot : j * slot + b - a]
        else:  # the allgather overwrites the segment: the reduce-scatter send reading it must end
            earlier = sending.pop((got, j), None)
            if earlier is not None:
                earlier.wait()
            target = arr[a:b]
        # eager: the payload's receive is posted now (sizes were agreed), so the left
        # neighbour's gloo may send it the moment it is ready, without a round trip
        return comm.irecv(target, left, SEGMENT_TAGS[_tag_phase(phase)] + j, eager=True)

    for j in range(segments):
        send(0, j)
    recvs = [post_receive(0, j) for j in range(segments)]
    for k, (phase, _, got) in enumerate(schedule):
        last = k + 1 == len(schedule)
        for j in range(segments):
            recvs[j].wait()
            if mark:
                mark((k, j, time.perf_counter()))
            if phase == "reduce-scatter":
                a, b = pieces[got][j]
                reduce_into(arr[a:b], scratch[j * slot : j * slot + b - a], op, bfloat16=bf16)
            if not last:
                # The chunk finished in step k is the one step k + 1 sends (after the last
                # reduce-scatter step: the chunk this rank now owns, the allgather's first send),
                # so segment j goes on at once; its slot is free for step k + 1's segment j.
                send(k + 1, j)
                recvs[j] = post_receive(k + 1, j)
    wait_all(list(sending.values()))
    if mark:
        mark((len(schedule), 0, time.perf_counter()))
    return tensor


def _agree_with_neighbours(comm: Communicator, arr: np.ndarray, right: int, left: int) -> None:
    """Raise CommMismatchError unless the left neighbour's buffer has this rank's size and dtype.

    Around the ring this checks every rank against every other: the eager receives below post
    payloads of the sizes this rank expects, which is only safe once the sizes are known equal.
    The check itself is always two int64, so its own receive may be eager (one trip, not two).
    """
    mine = np.array([arr.size, arr.dtype.num], dtype=np.int64)
    theirs = np.zeros(2, dtype=np.int64)
    recv = comm.irecv(theirs, left, AGREE_TAG, eager=True)
    wait_all([recv, comm.isend(mine, right, AGREE_TAG)])
    if not np.array_equal(mine, theirs):
        raise CommMismatchError(
            f"rank {comm.rank} has {arr.size} elements of {arr.dtype} (dtype number "
            f"{arr.dtype.num}) but rank {left} has {theirs[0]} of dtype number {theirs[1]}: "
            "every rank must pass a buffer of the same size and dtype"
        )


def _tag_phase(phase: str) -> str:
    return "ring_rs" if phase == "reduce-scatter" else "ring_ag"
