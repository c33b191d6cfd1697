"""The judges of A2: what Rabenseifner's algorithm sends to whom, and one rank's run against it.

From data only (the sum over ranks, what the answer returned, the built-ins it called and the
communicator's per-peer counters), so the kernel's check and the grader's probe
(:mod:`course_grader.assignments.a2.probe`) judge alike. The model of the wire: rank ``r``'s
partners ``r XOR 2^k`` (:func:`rabenseifner_partners`), the exact bytes it sends each
(:func:`rabenseifner_bytes_sent`; Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH"), and MPICH's folding on a world that is not a power of two
(:func:`folded_traffic`, section 4.4). A wrong run is matched with the usual mistakes (a
built-in collective, the wrong partners or bytes, a rank that sat out and got nothing back).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "folded_traffic",
    "judge_folded",
    "judge_not_power_of_two",
    "judge_rank",
    "rabenseifner_bytes_sent",
    "rabenseifner_partners",
]


def rabenseifner_partners(rank: int, world_size: int) -> list[int]:
    """Return ``rank XOR 2^k`` for ``k = 0 .. log2(world_size) - 1``: the ranks it exchanges with."""
    return [rank ^ (1 << k) for k in range(world_size.bit_length() - 1)]


def rabenseifner_bytes_sent(
    kind: str, size: int, itemsize: int, rank: int, world_size: int
) -> dict[int, int]:
    """Return ``{partner: bytes}`` that ``rank`` sends in ``kind`` ("reduce_scatter", ...).

    Blocks are runs of whole chunks (``chunk_bounds`` layout, chunk lengths differ by one at most).
    At distance ``d`` the halving reduce-scatter sends the ``d`` aligned chunks around
    ``rank XOR d`` (the half the partner keeps); the doubling allgather sends the ``d`` aligned
    chunks around ``rank`` (everything it has so far). Allreduce is both.
    """
    from course_lib.comm.buffers import chunk_bounds

    nbytes = [(stop - start) * itemsize for start, stop in chunk_bounds(size, world_size)]

    def block(owner: int, d: int) -> int:  # bytes of the d aligned chunks holding chunk `owner`
        first = owner // d * d
        return sum(nbytes[first : first + d])

    sent: dict[int, int] = {}
    for partner in rabenseifner_partners(rank, world_size):
        d = rank ^ partner
        scatter, gather = block(partner, d), block(rank, d)
        sent[partner] = {"reduce_scatter": scatter, "allgather": gather}.get(kind, scatter + gather)
    return sent


def folded_traffic(size: int, itemsize: int, rank: int, world_size: int) -> dict[int, tuple]:
    """Return ``{partner: (messages each way, bytes sent)}`` of ``rank`` in the folded allreduce.

    MPICH's folding (Thakur, Rabenseifner & Gropp 2005, section 4.4): ``N'`` is the largest power
    of two <= N, ``r = N - N'``. Even rank ``q < 2r`` sends its buffer to ``q + 1`` and gets the
    sum back (one whole buffer each way); the core (odd ranks below ``2r``, then every rank from
    ``2r``; core rank ``q // 2`` or ``q - r``) runs halving and doubling on ``N'`` ranks.
    """
    half = 1 << (world_size.bit_length() - 1)
    extra = world_size - half
    whole = size * itemsize
    if rank < 2 * extra and rank % 2 == 0:
        return {rank + 1: (1, whole)}
    core = rank // 2 if rank < 2 * extra else rank - extra
    traffic = {
        (2 * q + 1 if q < extra else q + extra): (2, nbytes)
        for q, nbytes in rabenseifner_bytes_sent("allreduce", size, itemsize, core, half).items()
    }
    if rank < 2 * extra:
        traffic[rank - 1] = (1, whole)
    return traffic


def judge_folded(
    size: int,
    dtype: str,
    rank: int,
    world_size: int,
    inputs: list[Any],
    got: Any,
    raised: str,
    builtin: list[str],
    peers: dict[int, tuple[int, int, int]],
) -> str:
    """Return "" or what is wrong with one rank of A2.3 run on ``world_size`` (not 2^k) ranks.

    ``inputs``: every rank's buffer; ``raised``: the exception's name ("" if it returned);
    ``peers``: {peer: (messages sent, received, bytes sent)} over the communicator and the
    sub-communicators the answer made, in its numbering. Shared by the kernel's check and the
    grader's (:mod:`course_grader.assignments.a2.probe`).
    """
    import numpy as np

    n = world_size
    half = 1 << (n.bit_length() - 1)
    extra = n - half
    folded = list(range(0, 2 * extra, 2))
    plan = (
        f"fold first: with N' = {half}, ranks {folded} send their buffer to the next odd rank "
        f"and sit out, the other {half} run halving and doubling on comm.subgroup(...)"
    )
    if raised:
        return f"on {n} ranks rank {rank} raised {raised}; {plan}"
    builtin = sorted(name for name in builtin if name != "barrier")
    if builtin:
        names = " and ".join(f"comm.{name}" for name in builtin)
        return f"on {n} ranks rank {rank} uses the built-in {names}; write it from send/recv"
    sits_out = rank in folded
    back = f"its partner rank {rank + 1} must send it the result at the end"
    if got is None:
        if sits_out:
            return f"on {n} ranks rank {rank} returned None; it sat out, so {back}"
        return f"on {n} ranks rank {rank} returned None; return the buffer"
    inputs = [np.asarray(x).reshape(-1) for x in inputs]
    reference = sum(inputs)
    got = np.asarray(got).reshape(-1)
    if got.shape != reference.shape or not np.array_equal(got, reference):
        if sits_out and got.shape == reference.shape and np.array_equal(got, inputs[rank]):
            return f"on {n} ranks rank {rank} returned its own input; it sat out, so {back}"
        lost = reference - sum(inputs[q] for q in folded)
        if got.shape == reference.shape and np.array_equal(got, lost):
            return (
                f"on {n} ranks the result on rank {rank} misses the buffers of ranks {folded}: "
                "each odd rank must add its even partner's buffer before the halving"
            )
        wrong = int((got != reference).sum()) if got.shape == reference.shape else "all"
        return f"size {size}: on {n} ranks the result on rank {rank} is wrong ({wrong} elements differ)"
    want = folded_traffic(size, np.dtype(dtype).itemsize, rank, n)
    partners = sorted(want)
    sent_to = sorted(p for p, (sent, _, _) in peers.items() if sent)
    received_from = sorted(p for p, (_, received, _) in peers.items() if received)
    if sent_to != partners or received_from != partners:
        return (
            f"on {n} ranks rank {rank} sent to ranks {sent_to} and received from "
            f"{received_from}; with MPICH's folding its partners are {partners} ({plan})"
        )
    for partner in partners:
        messages, nbytes = want[partner]
        sent, received, got_bytes = peers[partner]
        what = "its whole buffer" if partner in folded or sits_out else "halving and doubling"
        if got_bytes != nbytes:
            return (
                f"size {size}: on {n} ranks rank {rank} sent {got_bytes} bytes to rank {partner}, "
                f"folding sends exactly {nbytes} there ({dtype}: {what})"
            )
        if sent != messages or received != messages:
            return (
                f"size {size}: on {n} ranks rank {rank} sent {sent} messages to rank {partner} "
                f"and received {received}; folding exchanges exactly {messages} each way there "
                f"({what})"
            )
    return ""


def judge_rank(
    kind: str,
    size: int,
    dtype: str,
    rank: int,
    world_size: int,
    reference: Any,
    got: Any,
    builtin: list[str],
    peers: dict[int, tuple[int, int, int]],
) -> str:
    """Return "" or what is wrong with one rank's run, from data only.

    ``reference``: the sum over ranks; ``got``: what the answer returned; ``builtin``: the
    built-in collectives it called; ``peers``: {peer: (messages sent, received, bytes sent)}.
    Shared by the kernel-side check and the grader's (:mod:`course_grader.assignments.a2.probe`).
    """
    import numpy as np

    from course_lib.comm.buffers import chunk_bounds

    reference = np.asarray(reference).reshape(-1)
    lo, hi = chunk_bounds(size, world_size)[rank]
    if kind == "reduce_scatter":
        expected, part = reference[lo:hi], f"chunk {rank} (elements {lo}:{hi})"
    else:
        expected, part = reference, "the result"
    # A barrier moves no data, so it cannot stand in for the exchanges; every other built-in can.
    builtin = sorted(name for name in builtin if name != "barrier")
    if builtin:
        names = " and ".join(f"comm.{name}" for name in builtin)
        return f"rank {rank} uses the built-in {names}; write it from send/recv"
    if got is None:
        return f"rank {rank} returned None; return the buffer"
    got = np.asarray(got).reshape(-1)
    if kind == "reduce_scatter" and got.shape == reference.shape:
        got = got[lo:hi]
    if got.shape != expected.shape or not np.array_equal(got, expected):
        wrong = int((got != expected).sum()) if got.shape == expected.shape else "all"
        return f"size {size}: {part} on rank {rank} is wrong ({wrong} elements differ)"
    sent_to = sorted(p for p, (sent, _, _) in peers.items() if sent)
    received_from = sorted(p for p, (_, received, _) in peers.items() if received)
    partners = sorted(rabenseifner_partners(rank, world_size))
    if sent_to != partners or received_from != partners:
        return (
            f"rank {rank} sent to ranks {sent_to} and received from {received_from}; its partners "
            f"are r XOR 2^k = {partners}, exchange with each one both ways"
        )
    want = rabenseifner_bytes_sent(kind, size, np.dtype(dtype).itemsize, rank, world_size)
    for partner in partners:
        if peers[partner][2] != want[partner]:
            return (
                f"size {size}: rank {rank} sent {peers[partner][2]} bytes to rank "
                f"{partner}, the algorithm sends exactly {want[partner]} there ({dtype}); "
                "send only the half of the block the partner keeps (or, gathering, your block)"
            )
    # One message each way per step: reduce-scatter and allgather meet each partner once, the
    # allreduce twice. The same bytes cut into more messages pay more latency (alpha per message).
    steps = 2 if kind == "allreduce" else 1
    for partner in partners:
        sent, received, _ = peers[partner]
        if sent > steps or received > steps:
            return (
                f"size {size}: rank {rank} sent {sent} messages to rank {partner} and received "
                f"{received}; the algorithm exchanges one message each way per step ({steps} "
                "with this partner): send the whole half block in one sendrecv, not piece by piece"
            )
    return ""


def judge_not_power_of_two(rank: int, world_size: int, raised: str, messages: int) -> str:
    """Return "" or what is wrong with one rank of A2.1 run on ``world_size`` (not 2^k) ranks.

    ``raised``: the name of the exception the answer raised there ("" if it returned);
    ``messages``: the messages it sent and the collectives it called before that.
    Shared by the kernel-side check and the grader's (:mod:`course_grader.assignments.a2.probe`).
    """
    if raised == "ValueError" and not messages:
        return ""
    if raised == "ValueError":  # e.g. the communicator's own "peer out of range", mid-algorithm
        return (
            f"on {world_size} ranks rank {rank} sent {messages} messages before its ValueError; "
            "check that comm.world_size is a power of two before the first message"
        )
    what = f"raised {raised}" if raised else "returned"
    return (
        f"on {world_size} ranks (not a power of two) rank {rank} {what}; raise ValueError "
        "when comm.world_size is not a power of two, before any message"
    )
