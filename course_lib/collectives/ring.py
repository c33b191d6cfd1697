"""Lecture 3: Ring reduce-scatter, ring allgather and ring allreduce, written from point-to-point messages.

The buffer is cut into ``world_size`` chunks (``chunk_bounds`` layout). In each of the ``N - 1``
reduce-scatter steps every rank passes one chunk to its right neighbour and adds the chunk it got
from its left one; after them rank ``r`` holds the complete reduction of chunk ``r``. The
allgather passes the finished chunks round the ring in ``N - 1`` more steps. Every rank sends
``2 (N - 1) / N`` of the buffer in total, which is why the ring is bandwidth-optimal
(Patarasuk & Yuan 2009; source 001 calls it ring-allreduce in 2(N-1) steps).
"""

from __future__ import annotations

import numpy as np

from course_lib.collectives.common import TAGS, reduce_into, reducible_flat
from course_lib.comm.buffers import Buffer, as_flat_array, chunk_bounds, dtype_name
from course_lib.comm.communicator import CommError, CommMismatchError, Communicator

__all__ = ["ring_allgather", "ring_allreduce", "ring_reduce_scatter", "ring_schedule"]


def ring_schedule(rank: int, world_size: int) -> list[tuple[str, int, int]]:
    """Return ``(phase, chunk sent, chunk received)`` for each of this rank's ``2 (N - 1)`` steps."""
    p, steps = world_size, []
    for k in range(p - 1):  # reduce-scatter: send chunk r-k-1, receive (and add) chunk r-k-2
        steps.append(("reduce-scatter", (rank - k - 1) % p, (rank - k - 2) % p))
    for k in range(p - 1):  # allgather: send chunk r-k (own first), receive chunk r-k-1
        steps.append(("allgather", (rank - k) % p, (rank - k - 1) % p))
    return steps


def ring_reduce_scatter(
    comm: Communicator, tensor: Buffer, op: str = "sum", *, eager: bool = False
) -> Buffer:
    """Reduce ``tensor`` so that chunk ``rank`` holds the result; every rank calls it.

    Modifies ``tensor`` in place: afterwards chunk ``rank`` is complete and the other chunks hold
    partial results. Cost: $(N-1)(\\alpha + \\frac{n}{N}\\beta)$ for an ``n``-byte buffer.
    ``eager=True``: the ranks already agreed on the buffer's size (see ``Communicator.irecv``).
    """
    # bfloat16 (a torch tensor) travels as its bits, added as torch adds bfloat16 (FSDP's reduce)
    bf16 = not isinstance(tensor, np.ndarray) and dtype_name(tensor) == "bfloat16"
    arr = reducible_flat(tensor, op, bfloat16_ok=bf16)
    p, r = comm.world_size, comm.rank
    if p == 1:
        return tensor
    bounds = chunk_bounds(arr.size, p)
    scratch = np.empty(bounds[0][1] - bounds[0][0], dtype=arr.dtype)  # chunk 0 is the longest
    right, left = (r + 1) % p, (r - 1) % p
    try:
        for _, sent, got in ring_schedule(r, p)[: p - 1]:
            (a, b), (c, d) = bounds[sent], bounds[got]
            comm.sendrecv(arr[a:b], right, scratch[: d - c], left, tag=TAGS["ring_rs"], eager=eager)
            reduce_into(arr[c:d], scratch[: d - c], op, bfloat16=bf16)
    except CommError as exc:
        raise _blame_sizes(comm, tensor, exc) from exc
    return tensor


def ring_allgather(comm: Communicator, tensor: Buffer, *, eager: bool = False) -> Buffer:
    """Fill every chunk of ``tensor`` from the rank that owns it (chunk ``r`` from rank ``r``).

    Modifies ``tensor`` in place; every rank calls it with a buffer of the same size (``eager``:
    as in :func:`ring_reduce_scatter`).
    Cost: $(N-1)(\\alpha + \\frac{n}{N}\\beta)$ for an ``n``-byte buffer.
    """
    arr = as_flat_array(tensor)
    p, r = comm.world_size, comm.rank
    if p == 1:
        return tensor
    bounds = chunk_bounds(arr.size, p)
    right, left = (r + 1) % p, (r - 1) % p
    try:
        for _, sent, got in ring_schedule(r, p)[p - 1 :]:
            (a, b), (c, d) = bounds[sent], bounds[got]
            comm.sendrecv(arr[a:b], right, arr[c:d], left, tag=TAGS["ring_ag"], eager=eager)
    except CommError as exc:
        raise _blame_sizes(comm, tensor, exc) from exc
    return tensor


def ring_allreduce(
    comm: Communicator, tensor: Buffer, op: str = "sum", *, eager: bool = False
) -> Buffer:
    """Reduce ``tensor`` over all ranks in place: ring reduce-scatter, then ring allgather.

    Every rank calls it with a buffer of the same size and dtype and ends with bitwise equal
    results (each chunk is reduced once, by its owner). Cost: $2(N-1)(\\alpha + \\frac{n}{N}\\beta)$.
    ``eager=True`` only where the ranks agreed on the size beforehand (it skips a round trip).
    """
    ring_reduce_scatter(comm, tensor, op, eager=eager)
    return ring_allgather(comm, tensor, eager=eager)


def _blame_sizes(comm: Communicator, tensor: Buffer, exc: CommError) -> CommError:
    """Return the error to raise for ``exc``: one naming the rank whose buffer differs, if any.

    A rank sees only its neighbours: the one that catches a mismatch blamed its left neighbour
    (even when its own size was the odd one), and the others timed out blaming theirs. So every
    rank whose ring failed swaps its size and dtype with the others; where the reports differ,
    the ranks outside the majority are named (with two ranks, or a tie, every size is listed).
    """
    arr, name = as_flat_array(tensor), dtype_name(tensor)
    theirs, silent = comm.compare_after_failure(arr, name, isinstance(exc, CommMismatchError))
    groups: dict[tuple[int, str], list[int]] = {}
    for rank, value in sorted({comm.rank: (arr.size, name), **theirs}.items()):
        groups.setdefault(value, []).append(rank)
    if len(groups) == 1:
        return exc  # the sizes agree (or nobody answered): not a mismatch, the error as it was

    def has(value: tuple[int, str]) -> str:
        ranks = groups[value]
        who = f"rank {ranks[0]} has" if len(ranks) == 1 else f"ranks {ranks} have"
        return f"{who} {value[0]} {value[1]} elements"

    common = max(groups, key=lambda v: len(groups[v]))
    if 2 * len(groups[common]) > len(theirs) + 1:  # a majority agrees: the others differ
        verdict = "; ".join(has(v) for v in groups if v != common)
        verdict += f" where the other ranks {groups[common]} have {common[0]} {common[1]}"
    else:  # two ranks, or a tie: every size, none blamed
        verdict = "; ".join(has(v) for v in groups)
    unknown = f" (rank(s) {silent} did not report)" if silent else ""
    return CommMismatchError(
        f"rank {comm.rank}: the ring failed because the ranks' buffers differ: {verdict}"
        f"{unknown}. Every rank must pass a buffer of the same size and dtype. What rank "
        f"{comm.rank} saw itself: {exc}"
    )
