"""Recursive-doubling allreduce for any world size, from point-to-point messages."""

from __future__ import annotations

import numpy as np

from course_lib.collectives.common import TAGS, reduce_into, reducible_flat
from course_lib.comm.buffers import Buffer
from course_lib.comm.communicator import Communicator

__all__ = ["recursive_doubling_allreduce"]


def recursive_doubling_allreduce(comm: Communicator, tensor: Buffer, op: str = "sum") -> Buffer:
    """Reduce ``tensor`` in place: at step k, exchange the whole buffer with rank ``r XOR 2^k``.

    Every rank calls it. For a world size that is not a power of two, the ``N - 2^m`` extra ranks
    first hand their buffer to a partner and get the result back at the end (Thakur, Rabenseifner
    & Gropp 2005). Few, large messages: cost $\\lfloor\\log_2 N\\rfloor(\\alpha + n\\beta)$ (the
    exchanges among the largest power of two of ranks), plus $2(\\alpha + n\\beta)$ when ``N`` is
    not a power of two; good for small buffers (latency-bound), worse than the ring for large ones.
    """
    arr = reducible_flat(tensor, op)
    p, r = comm.world_size, comm.rank
    if p == 1:
        return tensor
    tag = TAGS["doubling"]
    p2 = 1 << (p.bit_length() - 1)  # largest power of two <= p
    if r >= p2:  # an extra rank: its partner r - p2 does the work
        comm.send(arr, r - p2, tag)
        comm.recv(arr, r - p2, tag)
        return tensor
    scratch = np.empty_like(arr)
    if r < p - p2:
        comm.recv(scratch, r + p2, tag)
        reduce_into(arr, scratch, op)
    mask = 1
    while mask < p2:
        partner = r ^ mask
        comm.sendrecv(arr, partner, scratch, partner, tag)
        reduce_into(arr, scratch, op)  # a + b == b + a in IEEE arithmetic: partners stay equal
        mask <<= 1
    if r < p - p2:
        comm.send(arr, r + p2, tag)
    return tensor
