"""No lecture (the grader). Answers that let a built-in collective do the work and rewrite the counters to hide it.

A rank's communicator counts its messages and bytes in the student's own process, and the
counters are public (``comm.stats``), so an answer can reset them after a built-in collective
and write what the assignment's algorithm would have counted: the right numbers, the right
partners, the right bytes, nothing built-in. The grader's judges, which read those counters,
give it full marks; the bytes on the wire (:mod:`course_grader.verdict.wire`) do not agree
and take them away. Each is written as a student would, and passes the ``ast`` guard.
"""

from __future__ import annotations

__all__ = ["FORGED_COUNTERS", "WIRE_REASON"]

#: The reason such an answer's FAIL must give (a regex).
WIRE_REASON = r"bytes on the wire, but the ranks reported"

_A2_1 = """
def reduce_scatter_halving(comm, x):
    r, p = comm.rank, comm.world_size
    if p & (p - 1):
        raise ValueError(f"recursive halving needs a power-of-two world size, not {p}")
    total = comm.allreduce(x.copy())  # the built-in does the work...
    comm.stats.reset()  # ...and the counters say recursive halving did
    bounds = chunk_bounds(len(x), p)
    lo, hi = 0, p
    d = p // 2
    while d >= 1:
        mid = lo + d
        keep, give = ((mid, hi), (lo, mid)) if r & d else ((lo, mid), (mid, hi))
        a, b = bounds[give[0]][0], bounds[give[1] - 1][1]
        c, e = bounds[keep[0]][0], bounds[keep[1] - 1][1]
        peer = comm.stats.peer(r ^ d)
        peer.messages_sent += 1
        peer.messages_received += 1
        peer.bytes_sent += (b - a) * x.itemsize
        peer.bytes_received += (e - c) * x.itemsize
        lo, hi = keep
        d //= 2
    x[:] = total
    return x
"""

_A4_1 = """
def weighted_average(comm, w, n):
    total = comm.allreduce(w * n)  # two calls, where the exercise asks for one...
    count = comm.allreduce(np.array([n], dtype=w.dtype))
    comm.stats.reset()  # ...and the counters say one allreduce of w.size + 1 values
    comm.stats.collective("allreduce").add((w.size + 1) * w.itemsize, 0.0)
    w[:] = total / count[0]
    return w
"""

_A4_3 = """
def directed_gossip(comm, x, num_steps):
    r, p = comm.rank, comm.world_size
    s = 1
    for _ in range(num_steps):
        every = comm.allgather(x.copy())  # the built-in brings every rank's x...
        x += every[(r - s) % p]
        x /= 2
        comm.stats.reset()  # ...and the counters say sendrecv did, step after step
        s = s + 1 if s + 1 <= p / 2 else 1
    s = 1
    for _ in range(num_steps):
        out, back = comm.stats.peer((r + s) % p), comm.stats.peer((r - s) % p)
        out.messages_sent += 1
        out.bytes_sent += x.nbytes
        back.messages_received += 1
        back.bytes_received += x.nbytes
        s = s + 1 if s + 1 <= p / 2 else 1
    return x
"""

_A3_1 = """
def ps_average(comm, flat, server):
    from course_lib.comm import chunk_bounds

    r, n = comm.rank, comm.world_size
    comm.allreduce(flat)  # the built-in does the work...
    flat /= n
    comm.stats.collectives.pop("allreduce", None)  # ...and the counters say the servers did
    bounds = chunk_bounds(flat.size, n)
    mine = bounds[(r - server) % n][1] - bounds[(r - server) % n][0]
    for peer in range(n):
        if peer != r:
            a, b = bounds[(peer - server) % n]
            counts = comm.stats.peer(peer)
            counts.messages_sent += 2
            counts.bytes_sent += (b - a + mine) * flat.itemsize
            counts.messages_received += 2
            counts.bytes_received += (b - a + mine) * flat.itemsize
    return flat
"""

_A3_3 = """
def bucket_average(comm, flat):
    from course_lib.comm import chunk_bounds

    r, n = comm.rank, comm.world_size
    comm.allreduce(flat)  # the built-in does the work...
    flat /= n
    comm.stats.collectives.pop("allreduce", None)  # ...and the counters say the ring did
    bounds = chunk_bounds(flat.size, n)
    right, left = comm.stats.peer((r + 1) % n), comm.stats.peer((r - 1) % n)
    for k in range(n - 1):
        (a, b), (c, d) = bounds[(r - k) % n], bounds[(r - k - 1) % n]
        right.messages_sent += 1
        right.bytes_sent += (b - a) * flat.itemsize
        left.messages_received += 1
        left.bytes_received += (d - c) * flat.itemsize
    for k in range(n - 1):
        (a, b), (c, d) = bounds[(r + 1 - k) % n], bounds[(r - k) % n]
        right.messages_sent += 1
        right.bytes_sent += (b - a) * flat.itemsize
        left.messages_received += 1
        left.bytes_received += (d - c) * flat.itemsize
    return flat
"""

_A9_2 = """
def ring_attention_forward(comm, q, k, v, T):
    r, n = comm.rank, comm.world_size
    bounds = chunk_bounds(T, n)
    widest = bounds[0][1] - bounds[0][0]
    mine = torch.zeros(2, q.shape[0], widest, q.shape[-1])
    mine[:, :, : k.shape[1]] = torch.stack([k, v])
    every = comm.allgather(mine)  # the built-in brings every rank's keys and values...
    comm.stats.reset()  # ...and the counters say the ring did
    keys = torch.cat([every[i, 0, :, : b - a] for i, (a, b) in enumerate(bounds)], -2)
    values = torch.cat([every[i, 1, :, : b - a] for i, (a, b) in enumerate(bounds)], -2)
    lo, hi = bounds[r]
    s = q @ keys.transpose(-1, -2) * q.shape[-1] ** -0.5
    later = torch.arange(T)[None, :] > torch.arange(lo, hi)[:, None]
    out = torch.softmax(s.masked_fill(later, float("-inf")), -1) @ values
    right, left = comm.stats.peer((r + 1) % n), comm.stats.peer((r - 1) % n)
    for step in range(n - 1):
        a, b = bounds[(r - step) % n]
        c, d = bounds[(r - step - 1) % n]
        right.messages_sent += 1
        right.bytes_sent += 2 * q.shape[0] * (b - a) * q.shape[-1] * 4
        left.messages_received += 1
        left.bytes_received += 2 * q.shape[0] * (d - c) * q.shape[-1] * 4
    return out
"""

#: (assignment, exercise) -> the whole answer cell.
FORGED_COUNTERS = {
    ("A2", "A2.1"): _A2_1,
    ("A3", "A3.1"): _A3_1,
    ("A3", "A3.3"): _A3_3,
    ("A4", "A4.1"): _A4_1,
    ("A4", "A4.3"): _A4_3,
    ("A9", "A9.2"): _A9_2,
}
