"""One gossip step with a rotating partner distance (source 001, Algorithm 2, after GossipGraD)."""

from __future__ import annotations

import numpy as np

from course_lib.collectives.common import TAGS, reducible_flat
from course_lib.comm.buffers import Buffer
from course_lib.comm.communicator import Communicator, wait_all

__all__ = ["gossip_partners", "gossip_step", "next_distance"]


def gossip_partners(rank: int, world_size: int, s: int) -> tuple[int, int]:
    """Return ``(l, r)``: ``l = (i - s + P) mod P`` and ``r = (i + s) mod P`` (source 001)."""
    return (rank - s + world_size) % world_size, (rank + s) % world_size


def next_distance(s: int, world_size: int) -> int:
    """Return the next partner distance: ``s + 1``, back to 1 once it exceeds ``P / 2``."""
    s += 1
    return 1 if s > world_size / 2 else s


def gossip_step(comm: Communicator, tensor: Buffer, s: int = 1) -> Buffer:
    """Replace ``tensor`` in place by $(x_l + x_i + x_r) / 3$ with the partners at distance ``s``.

    Every rank calls it with the same ``s`` and a floating-point buffer of the same size. When
    both partners are the same rank (``P = 2``, or ``s = P / 2``), it is exchanged once and
    counted twice, exactly as Algorithm 2 is written. Each rank sends two messages, whatever the
    world size: cost $2(\\alpha + n\\beta)$ (or one exchange when ``l = r``).
    """
    arr = reducible_flat(tensor, "sum")
    if arr.dtype.kind != "f":
        raise TypeError(f"gossip averages, so it needs a floating-point buffer, got {arr.dtype}")
    p, i = comm.world_size, comm.rank
    if p == 1:
        return tensor
    if not 1 <= s < p:
        raise ValueError(f"distance s must be in 1..{p - 1}, got {s}")
    left, right = gossip_partners(i, p, s)
    tag = TAGS["gossip"]
    from_left = np.empty_like(arr)
    if left == right:
        comm.sendrecv(arr, right, from_left, left, tag)
        from_right = from_left
    else:
        from_right = np.empty_like(arr)
        handles = [comm.irecv(from_left, left, tag), comm.irecv(from_right, right, tag)]
        handles += [comm.isend(arr, right, tag), comm.isend(arr, left, tag)]
        wait_all(handles)
    arr += from_left
    arr += from_right
    arr /= 3
    return tensor
