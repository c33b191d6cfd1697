"""Lecture 6: One gossip step with a rotating partner distance (source 001, Algorithm 2, after GossipGraD)."""

from __future__ import annotations

import numpy as np

from course_lib.collectives.common import TAGS, reducible_flat
from course_lib.comm.buffers import Buffer
from course_lib.comm.communicator import Communicator, wait_all

__all__ = [
    "gossip_partners",
    "gossip_sparse_exchange",
    "gossip_sparse_step",
    "gossip_step",
    "next_distance",
]


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


def _exchange_sparse(
    comm: Communicator, index: np.ndarray, values: np.ndarray, peer_out: int, peer_in: int
) -> tuple[np.ndarray, np.ndarray]:
    """Send ``index``/``values`` to ``peer_out``, receive ``peer_in``'s; return them.

    Variable-length payloads: the count goes first (one int64), so the receiver can size its
    buffers; an empty selection sends the count alone.
    """
    tag = TAGS["gossip_sparse"]
    count_in = np.zeros(1, np.int64)
    count_out = np.array([index.size], np.int64)
    wait_all([comm.irecv(count_in, peer_in, tag), comm.isend(count_out, peer_out, tag)])
    n = int(count_in[0])
    idx_in, val_in = np.empty(n, np.int32), np.empty(n, values.dtype)
    handles = []
    if n:
        handles += [comm.irecv(idx_in, peer_in, tag + 1), comm.irecv(val_in, peer_in, tag + 2)]
    if index.size:
        handles += [comm.isend(index, peer_out, tag + 1), comm.isend(values, peer_out, tag + 2)]
    wait_all(handles)
    return idx_in, val_in


def gossip_sparse_exchange(
    comm: Communicator, index: np.ndarray, values: np.ndarray, s: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Send ``(index, values)`` to both partners at distance ``s``; return what each sent.

    ``index`` (int32) and ``values`` may have any length, different on every rank. Returns
    two ``(indices, values)`` pairs, the left partner's first; when ``l = r`` the one exchange
    is returned twice, as Algorithm 2 counts it. Bytes per partner: 8 + ``index.nbytes`` +
    ``values.nbytes``.
    """
    p, i = comm.world_size, comm.rank
    if not 1 <= s < p:
        raise ValueError(f"distance s must be in 1..{p - 1}, got {s}")
    index = np.ascontiguousarray(index, dtype=np.int32)
    values = np.ascontiguousarray(values)
    left, right = gossip_partners(i, p, s)
    from_left = _exchange_sparse(comm, index, values, right, left)
    if left == right:
        return [from_left, from_left]
    return [from_left, _exchange_sparse(comm, index, values, left, right)]


def gossip_sparse_step(
    comm: Communicator, tensor: Buffer, s: int, threshold: float, flags: int = 0
) -> tuple[Buffer, np.ndarray]:
    """Algorithm 3 of source 001: gossip only the components with ``|x| > threshold``.

    Each rank sends its partners at distance ``s`` the indices (int32) and values of its
    components above ``threshold`` (after a count, so the lengths may differ), and replaces
    ``tensor`` in place by $(\\hat x_l + \\hat x_i + \\hat x_r) / 3$, where $\\hat x$ keeps the
    components above the threshold and is zero elsewhere (its own too: a component that nobody
    sent becomes 0, i.e. that weight is not updated). Returns ``tensor`` and the sorted indices
    that any of the three sent. Bytes per partner: 8 + 8 per component sent.

    The last ``flags`` components are presence flags (0 or 1, one per tensor, as a data-parallel
    exchange appends them): each one that is set travels whatever the threshold, so the mixed
    flag is 0 only where none of the three ranks had that tensor's gradient.
    """
    arr = reducible_flat(tensor, "sum")
    if arr.dtype.kind != "f":
        raise TypeError(f"gossip averages, so it needs a floating-point buffer, got {arr.dtype}")
    if not threshold >= 0:
        raise ValueError(f"threshold must be >= 0 (source 001 found t = 1 best), got {threshold}")
    if comm.world_size == 1:  # nobody to gossip with: unchanged, as gossip_step
        return tensor, np.arange(arr.size)
    chosen = np.abs(arr) > threshold
    if flags:
        chosen[arr.size - flags :] = arr[arr.size - flags :] != 0
    index = np.flatnonzero(chosen).astype(np.int32)
    values = arr[index].copy()
    mixed = np.zeros_like(arr)
    mixed[index] = values
    touched = [index]
    for idx_in, val_in in gossip_sparse_exchange(comm, index, values, s):
        np.add.at(mixed, idx_in, val_in)
        touched.append(idx_in)
    arr[:] = mixed / 3
    return tensor, np.unique(np.concatenate(touched))
