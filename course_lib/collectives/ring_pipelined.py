"""The ring allreduce with each chunk cut into segments, so the link never waits for arithmetic.

:func:`~course_lib.collectives.ring.ring_allreduce` moves a whole chunk per step, then adds it:
while it adds, its link is idle, and the next step starts only when the whole chunk has landed.
Here every chunk travels as segments (about ``segment_bytes`` each). A segment is reduced as soon
as it arrives, and, because the chunk a rank sends in step ``k + 1`` is the one it received in
step ``k``, forwarded to the right neighbour at once, while the later segments of step ``k`` are
still in flight. This is the pipelining of Patarasuk & Yuan (2009) and of the segmented rings in
NCCL and gloo: the sends of consecutive steps overlap, and only one segment's arithmetic is left
on the critical path. The result is bitwise the same as the plain ring (same chunks, same owners,
same order of additions).
"""

from __future__ import annotations

import numpy as np

from course_lib.collectives.common import reduce_into, reducible_flat
from course_lib.collectives.ring import ring_schedule
from course_lib.comm.buffers import Buffer, chunk_bounds
from course_lib.comm.communicator import CommMismatchError, Communicator, wait_all

__all__ = ["SEGMENT_TAGS", "ring_allreduce_pipelined", "segment_bounds"]

# One tag per segment index, so segments in flight between the same two ranks cannot swap:
# reduce-scatter segments use 8120 + j, allgather segments 8156 + j (j < MAX_SEGMENTS).
SEGMENT_TAGS = {"ring_rs": 8120, "ring_ag": 8156}
AGREE_TAG = 8119  # the neighbours compare buffer sizes before any eager receive is posted
MAX_SEGMENTS = 36
DEFAULT_SEGMENT_BYTES = 1 << 20  # 1 MiB: long enough to fill the link, short enough to pipeline


def segment_bounds(start: int, stop: int, segments: int) -> list[tuple[int, int]]:
    """Cut ``[start, stop)`` into ``segments`` contiguous pieces whose lengths differ by <= 1."""
    return [(start + a, start + b) for a, b in chunk_bounds(stop - start, segments)]


def ring_allreduce_pipelined(
    comm: Communicator,
    tensor: Buffer,
    op: str = "sum",
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> Buffer:
    """Reduce ``tensor`` over all ranks in place, as the ring does, with segments pipelined.

    Every rank calls it with a buffer of the same size and dtype (and the same ``segment_bytes``)
    and ends with results bitwise equal to :func:`~course_lib.collectives.ring_allreduce`'s.
    Cost: $2(N-1)(\\alpha + \\frac{n}{N}\\beta)$ with the reductions hidden behind the transfers.
    """
    if segment_bytes < 1:
        raise ValueError(f"segment_bytes must be >= 1, got {segment_bytes}")
    arr = reducible_flat(tensor, op)
    p, r = comm.world_size, comm.rank
    if p == 1 or arr.size == 0:
        return tensor
    bounds = chunk_bounds(arr.size, p)
    longest = bounds[0][1] - bounds[0][0]
    segments = int(min(MAX_SEGMENTS, max(1, np.ceil(longest * arr.itemsize / segment_bytes))))
    right, left = (r + 1) % p, (r - 1) % p
    _agree_with_neighbours(comm, arr, right, left)
    schedule = ring_schedule(r, p)
    scratch = np.empty(longest, dtype=arr.dtype)
    pieces = {c: segment_bounds(*bounds[c], segments) for c in range(p)}

    sent: dict[int, list] = {c: [] for c in range(p)}  # sends still reading each chunk

    def send_segment(chunk: int, j: int, phase: str) -> None:
        a, b = pieces[chunk][j]
        sent[chunk].append(comm.isend(arr[a:b], right, SEGMENT_TAGS[_tag_phase(phase)] + j))

    for j in range(segments):
        send_segment(schedule[0][1], j, schedule[0][0])
    for k, (phase, _, got) in enumerate(schedule):
        start = bounds[got][0]
        if (
            phase == "allgather"
        ):  # about to overwrite chunk `got`: its reduce-scatter send must be done
            wait_all(sent[got])
        recvs = []
        for j, (a, b) in enumerate(pieces[got]):
            target = scratch[a - start : b - start] if phase == "reduce-scatter" else arr[a:b]
            # eager: every segment's receive is posted now, so the left neighbour's sends flow
            # while this rank reduces (gloo sends only into a posted receive)
            tag = SEGMENT_TAGS[_tag_phase(phase)] + j
            recvs.append(comm.irecv(target, left, tag, eager=True))
        # The chunk finished in this step is the one the next step sends (after the last
        # reduce-scatter step: the chunk this rank now owns, the allgather's first send), so each
        # segment goes on as soon as it is ready, while the later ones are still arriving.
        nxt = schedule[k + 1][0] if k + 1 < len(schedule) else None
        for j, (a, b) in enumerate(pieces[got]):
            recvs[j].wait()
            if phase == "reduce-scatter":
                reduce_into(arr[a:b], scratch[a - start : b - start], op)
            if nxt is not None:
                send_segment(got, j, nxt)
    wait_all([h for handles in sent.values() for h in handles])
    return tensor


def _agree_with_neighbours(comm: Communicator, arr: np.ndarray, right: int, left: int) -> None:
    """Raise CommMismatchError unless the left neighbour's buffer has this rank's size and dtype.

    Around the ring this checks every rank against every other: the eager receives below post
    payloads of the sizes this rank expects, which is only safe once the sizes are known equal.
    """
    mine = np.array([arr.size, arr.dtype.num], dtype=np.int64)
    theirs = np.zeros(2, dtype=np.int64)
    comm.sendrecv(mine, right, theirs, left, tag=AGREE_TAG)
    if not np.array_equal(mine, theirs):
        raise CommMismatchError(
            f"rank {comm.rank} has {arr.size} elements of {arr.dtype} (dtype number "
            f"{arr.dtype.num}) but rank {left} has {theirs[0]} of dtype number {theirs[1]}: "
            "every rank must pass a buffer of the same size and dtype"
        )


def _tag_phase(phase: str) -> str:
    return "ring_rs" if phase == "reduce-scatter" else "ring_ag"
