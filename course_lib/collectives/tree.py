"""Lecture 3: Recursive-doubling allreduce for any world size, from point-to-point messages."""

from __future__ import annotations

import numpy as np

from course_lib.collectives.common import TAGS, reduce_into, reducible_flat
from course_lib.comm.buffers import Buffer
from course_lib.comm.communicator import Communicator

__all__ = ["doubling_schedule", "recursive_doubling_allreduce"]


def doubling_schedule(rank: int, world_size: int) -> list[tuple[str, int]]:
    """Return ``(action, partner)`` for each message step of ``rank`` in recursive doubling.

    Actions: ``"send"`` / ``"recv"`` (fold an extra rank in or out) and ``"exchange"`` (send and
    receive the whole buffer at once). With $2^m$ the largest power of two $\\le N$, ranks below
    $N - 2^m$ take 1 + m + 1 steps, the others m (or 2 if they are the extra ranks); the longest
    schedule is the critical path, $\\lfloor\\log_2 N\\rfloor + 2$ steps when $N$ is not a power
    of two, $\\log_2 N$ when it is (Thakur, Rabenseifner & Gropp 2005).
    """
    p, r = world_size, rank
    if p <= 1:
        return []
    p2 = 1 << (p.bit_length() - 1)  # largest power of two <= p
    if r >= p2:  # an extra rank: its partner r - p2 does the work
        return [("send", r - p2), ("recv", r - p2)]
    steps = [("recv", r + p2)] if r < p - p2 else []
    mask = 1
    while mask < p2:
        steps.append(("exchange", r ^ mask))
        mask <<= 1
    if r < p - p2:
        steps.append(("send", r + p2))
    return steps


def recursive_doubling_allreduce(
    comm: Communicator, tensor: Buffer, op: str = "sum", *, eager: bool = False
) -> Buffer:
    """Reduce ``tensor`` in place: at step k, exchange the whole buffer with rank ``r XOR 2^k``.

    Every rank calls it and follows :func:`doubling_schedule`. For a world size that is not a
    power of two, the ``N - 2^m`` extra ranks first hand their buffer to a partner and get the
    result back at the end (Thakur, Rabenseifner & Gropp 2005). Few, large messages: cost
    $\\lfloor\\log_2 N\\rfloor(\\alpha + n\\beta)$, plus $2(\\alpha + n\\beta)$ when ``N`` is
    not a power of two; good for small buffers (latency-bound), worse than the ring for large ones.
    ``eager=True`` only where the ranks agreed on the size beforehand (it skips a round trip).
    """
    arr = reducible_flat(tensor, op)
    tag = TAGS["doubling"]
    scratch = np.empty_like(arr) if comm.world_size > 1 else arr
    schedule = doubling_schedule(comm.rank, comm.world_size)
    extra = bool(schedule) and comm.rank >= 1 << (comm.world_size.bit_length() - 1)
    for action, partner in schedule:
        if action == "exchange":
            comm.sendrecv(arr, partner, scratch, partner, tag, eager=eager)
            reduce_into(arr, scratch, op)  # a + b == b + a in IEEE arithmetic: partners stay equal
        elif action == "send":
            comm.send(arr, partner, tag)
        elif extra:  # an extra rank's receive is the finished result
            comm.recv(arr, partner, tag)
        else:  # a partner's receive folds the extra rank's buffer in
            comm.recv(scratch, partner, tag)
            reduce_into(arr, scratch, op)
    return tensor
