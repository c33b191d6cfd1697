"""Lecture 15: All-to-all written from point-to-point messages: the naive star and pairwise exchange.

Rank ``i`` holds blocks ``(i, 0..N-1)`` and must end with blocks ``(0..N-1, i)``: the transpose
of a matrix of blocks, the collective that routes tokens to experts (GShard, Lepikhin et al.
2020) and turns a sequence split into a head split (DeepSpeed-Ulysses). Pairwise exchange runs
``N - 1`` steps; in step ``k`` rank ``r`` sends its block for ``r + k`` and receives the block of
``r - k``, so every rank sends and receives exactly one block per step and no link is shared
(Thakur, Rabenseifner & Gropp 2005, MPICH's long-message algorithm). Each rank sends
$\\frac{N-1}{N}S$ bytes of an ``S``-byte buffer in ``N - 1`` messages: $(N-1)\\alpha +
\\frac{N-1}{N}S\\beta$, the same bytes as a ring's reduce-scatter, but every byte travels once.
"""

from __future__ import annotations

import numpy as np

from course_lib.collectives.common import TAGS
from course_lib.comm.buffers import Buffer, as_flat_array, like
from course_lib.comm.communicator import Communicator, Handle, wait_all
from course_lib.comm.splits import RowSplit, row_split

__all__ = ["all_to_all_naive", "pairwise_all_to_all", "pairwise_schedule"]


def pairwise_schedule(rank: int, world_size: int) -> list[tuple[int, int]]:
    """Return ``(dst, src)`` for each of this rank's ``N - 1`` steps: send to r+k, receive from r-k."""
    return [((rank + k) % world_size, (rank - k) % world_size) for k in range(1, world_size)]


def _split(comm: Communicator, tensor: Buffer, send_counts, recv_counts) -> RowSplit:
    """Cut the rows; swap the counts pairwise first when the receive counts are not given."""
    split = row_split(tensor, comm.world_size, send_counts, recv_counts)
    if split.recv_counts is not None:
        return split
    mine = np.asarray(split.send_counts, np.int64)
    theirs = mine.copy()  # theirs[r] = rows rank r sends here; our own count stays in place
    for dst, src in pairwise_schedule(comm.rank, comm.world_size):
        comm.sendrecv(
            mine[dst : dst + 1], dst, theirs[src : src + 1], src, TAGS["all_to_all_counts"]
        )
    return split.with_recv(theirs.tolist())


def _result(tensor: Buffer, split: RowSplit) -> tuple[np.ndarray, np.ndarray, Buffer]:
    """Return (flat input, flat output, output as the input's kind), own block already copied."""
    arr = as_flat_array(tensor)
    out = np.empty(split.out_shape[0] * split.width, dtype=arr.dtype)
    return arr, out, like(tensor, out)


def pairwise_all_to_all(
    comm: Communicator,
    tensor: Buffer,
    send_counts: list[int] | None = None,
    recv_counts: list[int] | None = None,
) -> Buffer:
    """All-to-all by pairwise exchange; same arguments and result as ``comm.all_to_all``.

    Every rank calls it. The input is unchanged; the result holds rank 0's rows first.
    """
    split = _split(comm, tensor, send_counts, recv_counts)
    arr, out, result = _result(tensor, split)
    sent, got, r = split.send_bounds(), split.recv_bounds(), comm.rank
    out[slice(*got[r])] = arr[slice(*sent[r])]  # the block a rank keeps never travels
    for dst, src in pairwise_schedule(r, comm.world_size):
        comm.sendrecv(arr[slice(*sent[dst])], dst, out[slice(*got[src])], src, TAGS["all_to_all"])
    return result.reshape(split.out_shape)


def all_to_all_naive(
    comm: Communicator,
    tensor: Buffer,
    send_counts: list[int] | None = None,
    recv_counts: list[int] | None = None,
) -> Buffer:
    """All-to-all by posting every send and receive at once; same contract as the pairwise one.

    The same bytes, but all ``N - 1`` messages of every rank are in flight together, so on a
    switch each rank's incoming link is shared by ``N - 1`` senders at the same moment (incast);
    pairwise exchange keeps one message per link per step, which is why MPI libraries use it
    for long blocks.
    """
    split = _split(comm, tensor, send_counts, recv_counts)
    arr, out, result = _result(tensor, split)
    sent, got, r = split.send_bounds(), split.recv_bounds(), comm.rank
    out[slice(*got[r])] = arr[slice(*sent[r])]
    peers = [p for p in range(comm.world_size) if p != r]
    handles: list[Handle] = [comm.irecv(out[slice(*got[p])], p, TAGS["all_to_all"]) for p in peers]
    handles += [comm.isend(arr[slice(*sent[p])], p, TAGS["all_to_all"]) for p in peers]
    wait_all(handles)
    return result.reshape(split.out_shape)
