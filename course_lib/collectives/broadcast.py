"""Lecture 3: Broadcast from point-to-point: the naive loop over ranks and the binomial tree."""

from __future__ import annotations

from course_lib.collectives.common import TAGS
from course_lib.comm.buffers import Buffer, as_flat_array
from course_lib.comm.communicator import Communicator, wait_all

__all__ = ["broadcast_naive", "tree_broadcast"]


def _check_src(comm: Communicator, src: int) -> None:
    if not 0 <= src < comm.world_size:
        raise ValueError(f"src {src} is out of range; valid ranks are 0..{comm.world_size - 1}")


def broadcast_naive(comm: Communicator, tensor: Buffer, src: int = 0) -> Buffer:
    """Overwrite ``tensor`` in place with ``src``'s copy, ``src`` sending to each rank in turn.

    Every rank calls it. Simple, but the source's link sends ``N - 1`` copies:
    cost $(N-1)(\\alpha + n\\beta)$.
    """
    _check_src(comm, src)
    arr, tag = as_flat_array(tensor), TAGS["bcast_naive"]
    if comm.rank == src:
        wait_all([comm.isend(arr, q, tag) for q in range(comm.world_size) if q != src])
    else:
        comm.recv(arr, src, tag)
    return tensor


def tree_broadcast(comm: Communicator, tensor: Buffer, src: int = 0) -> Buffer:
    """Overwrite ``tensor`` in place with ``src``'s copy along a binomial tree.

    Every rank calls it. Each rank that has the data passes it on, so the number of holders
    doubles every round: cost $\\lceil\\log_2 N\\rceil(\\alpha + n\\beta)$.
    """
    _check_src(comm, src)
    arr, tag = as_flat_array(tensor), TAGS["bcast"]
    p = comm.world_size
    vrank = (comm.rank - src) % p  # rank relative to the source, which becomes 0
    mask = 1
    while mask < p:  # receive once, from the rank that differs in our lowest set bit
        if vrank & mask:
            comm.recv(arr, (vrank - mask + src) % p, tag)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # then send to the ranks below us in the tree
        if vrank + mask < p:
            comm.send(arr, (vrank + mask + src) % p, tag)
        mask >>= 1
    return tensor
