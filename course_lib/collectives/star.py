"""Lecture 3: Star (parameter-server) allreduce and the naive all-to-all allreduce, from point-to-point."""

from __future__ import annotations

import numpy as np

from course_lib.collectives.common import TAGS, reduce_into, reducible_flat
from course_lib.comm.buffers import Buffer
from course_lib.comm.communicator import Communicator, wait_all

__all__ = ["allreduce_naive", "star_allreduce"]


def star_allreduce(comm: Communicator, tensor: Buffer, op: str = "sum", root: int = 0) -> Buffer:
    """Reduce ``tensor`` in place through one root: gather, reduce, send the result back.

    The shape of source 000's parameter server (steps 5-6: nodes send gradients to the server,
    which combines them and sends them back). Every rank calls it. The root's link carries every
    message, so the cost grows with the world size. The root posts all its receives, then all its
    sends, at once: their bytes queue on its link but their latencies overlap, so the cost is about
    $2\\alpha + 2(N-1)n\\beta$; :func:`~course_lib.cost_model.alpha_beta.predict` charges one
    $\\alpha$ per message, $2(N-1)(\\alpha + n\\beta)$ (lecture 3 compares both).
    """
    arr = reducible_flat(tensor, op)
    p, r = comm.world_size, comm.rank
    if not 0 <= root < p:
        raise ValueError(f"root {root} is out of range; valid ranks are 0..{p - 1}")
    if p == 1:
        return tensor
    tag = TAGS["star"]
    if r != root:
        comm.send(arr, root, tag)
        comm.recv(arr, root, tag)
        return tensor
    others = [q for q in range(p) if q != root]
    bufs = {q: np.empty_like(arr) for q in others}
    wait_all([comm.irecv(bufs[q], q, tag) for q in others])
    for q in others:  # fixed order, so the result does not depend on arrival order
        reduce_into(arr, bufs[q], op)
    wait_all([comm.isend(arr, q, tag) for q in others])
    return tensor


def allreduce_naive(comm: Communicator, tensor: Buffer, op: str = "sum") -> Buffer:
    """Reduce ``tensor`` in place by sending the whole buffer to every other rank.

    Every rank calls it. Nobody uses this in practice: each rank sends $(N-1)n$ bytes, so the
    cost $(N-1)(\\alpha + n\\beta)$ grows with the world size, unlike the ring's $2n$.
    """
    arr = reducible_flat(tensor, op)
    p, r = comm.world_size, comm.rank
    if p == 1:
        return tensor
    tag = TAGS["naive"]
    bufs = {q: (arr if q == r else np.empty_like(arr)) for q in range(p)}
    recvs = [comm.irecv(bufs[q], q, tag) for q in range(p) if q != r]
    sends = [comm.isend(arr, q, tag) for q in range(p) if q != r]
    wait_all(recvs + sends)
    total = bufs[0].copy()  # sum in rank order on every rank: bitwise equal results everywhere
    for q in range(1, p):
        reduce_into(total, bufs[q], op)
    arr[...] = total
    return tensor
