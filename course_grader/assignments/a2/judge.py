"""The judges of A2: what Rabenseifner's algorithm sends to whom, and one rank's run against it.

From data only (the sum over ranks, what the answer returned, the built-ins it called and the
communicator's per-peer counters), so the kernel's check and the grader's probe
(:mod:`course_grader.assignments.a2.probe`) judge alike. The model of the wire: rank ``r``'s
partners ``r XOR 2^k`` (:func:`rabenseifner_partners`), the exact bytes it sends each
(:func:`rabenseifner_bytes_sent`; Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH"), and MPICH's folding on a world that is not a power of two
(:func:`folded_traffic`, section 4.4). A wrong run is matched with the usual mistakes (a
built-in collective, the wrong partners or bytes, a rank that sat out and got nothing back).

Kept whole: the model of the wire and the judges that hold a run against it are one idea; the
length is the judges' messages, each a template for translation (``_("...").format``).
"""

from __future__ import annotations

from typing import Any

from course_lib.i18n import _

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


def _differ(got: Any, want: Any) -> str:
    """How many elements of ``got`` differ from ``want`` ("all" when the shapes differ), in words."""
    if got.shape != want.shape:
        return _("all elements differ")
    return _("{n} elements differ").format(n=int((got != want).sum()))


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
    plan = _(
        "fold first: with N' = {half}, ranks {folded} send their buffer to the next odd rank "
        "and sit out, the other {half} run halving and doubling on comm.subgroup(...)"
    ).format(half=half, folded=folded)
    if raised:
        return _("on {n} ranks rank {rank} raised {raised}; {plan}").format(
            n=n, rank=rank, raised=raised, plan=plan
        )
    builtin = sorted(name for name in builtin if name != "barrier")
    if builtin:
        names = _(" and ").join(f"comm.{name}" for name in builtin)
        return _(
            "on {n} ranks rank {rank} uses the built-in {names}; write it from send/recv"
        ).format(n=n, rank=rank, names=names)
    sits_out = rank in folded
    back = _("its partner rank {partner} must send it the result at the end").format(
        partner=rank + 1
    )
    if got is None:
        if sits_out:
            return _("on {n} ranks rank {rank} returned None; it sat out, so {back}").format(
                n=n, rank=rank, back=back
            )
        return _("on {n} ranks rank {rank} returned None; return the buffer").format(n=n, rank=rank)
    inputs = [np.asarray(x).reshape(-1) for x in inputs]
    reference = sum(inputs)
    got = np.asarray(got).reshape(-1)
    if got.shape != reference.shape or not np.array_equal(got, reference):
        if sits_out and got.shape == reference.shape and np.array_equal(got, inputs[rank]):
            return _(
                "on {n} ranks rank {rank} returned its own input; it sat out, so {back}"
            ).format(n=n, rank=rank, back=back)
        lost = reference - sum(inputs[q] for q in folded)
        if got.shape == reference.shape and np.array_equal(got, lost):
            return _(
                "on {n} ranks the result on rank {rank} misses the buffers of ranks {folded}: "
                "each odd rank must add its even partner's buffer before the halving"
            ).format(n=n, rank=rank, folded=folded)
        return _("size {size}: on {n} ranks the result on rank {rank} is wrong ({differ})").format(
            size=size, n=n, rank=rank, differ=_differ(got, reference)
        )
    want = folded_traffic(size, np.dtype(dtype).itemsize, rank, n)
    partners = sorted(want)
    sent_to = sorted(p for p, (sent, _r, _b) in peers.items() if sent)
    received_from = sorted(p for p, (_s, received, _b) in peers.items() if received)
    if sent_to != partners or received_from != partners:
        return _(
            "on {n} ranks rank {rank} sent to ranks {sent_to} and received from "
            "{received_from}; with MPICH's folding its partners are {partners} ({plan})"
        ).format(
            n=n,
            rank=rank,
            sent_to=sent_to,
            received_from=received_from,
            partners=partners,
            plan=plan,
        )
    for partner in partners:
        messages, nbytes = want[partner]
        sent, received, got_bytes = peers[partner]
        whole = partner in folded or sits_out
        what = _("its whole buffer") if whole else _("halving and doubling")
        if got_bytes != nbytes:
            return _(
                "size {size}: on {n} ranks rank {rank} sent {got} bytes to rank {partner}, "
                "folding sends exactly {want} there ({dtype}: {what})"
            ).format(
                size=size,
                n=n,
                rank=rank,
                got=got_bytes,
                partner=partner,
                want=nbytes,
                dtype=dtype,
                what=what,
            )
        if sent != messages or received != messages:
            return _(
                "size {size}: on {n} ranks rank {rank} sent {sent} messages to rank {partner} "
                "and received {received}; folding exchanges exactly {messages} each way there "
                "({what})"
            ).format(
                size=size,
                n=n,
                rank=rank,
                sent=sent,
                partner=partner,
                received=received,
                messages=messages,
                what=what,
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
        expected = reference[lo:hi]
        part = _("chunk {rank} (elements {lo}:{hi})").format(rank=rank, lo=lo, hi=hi)
    else:
        expected, part = reference, _("the result")
    # A barrier moves no data, so it cannot stand in for the exchanges; every other built-in can.
    builtin = sorted(name for name in builtin if name != "barrier")
    if builtin:
        names = _(" and ").join(f"comm.{name}" for name in builtin)
        return _("rank {rank} uses the built-in {names}; write it from send/recv").format(
            rank=rank, names=names
        )
    if got is None:
        return _("rank {rank} returned None; return the buffer").format(rank=rank)
    got = np.asarray(got).reshape(-1)
    if kind == "reduce_scatter" and got.shape == reference.shape:
        got = got[lo:hi]
    if got.shape != expected.shape or not np.array_equal(got, expected):
        return _("size {size}: {part} on rank {rank} is wrong ({differ})").format(
            size=size, part=part, rank=rank, differ=_differ(got, expected)
        )
    sent_to = sorted(p for p, (sent, _r, _b) in peers.items() if sent)
    received_from = sorted(p for p, (_s, received, _b) in peers.items() if received)
    partners = sorted(rabenseifner_partners(rank, world_size))
    if sent_to != partners or received_from != partners:
        return _(
            "rank {rank} sent to ranks {sent_to} and received from {received_from}; its partners "
            "are r XOR 2^k = {partners}, exchange with each one both ways"
        ).format(rank=rank, sent_to=sent_to, received_from=received_from, partners=partners)
    want = rabenseifner_bytes_sent(kind, size, np.dtype(dtype).itemsize, rank, world_size)
    for partner in partners:
        if peers[partner][2] != want[partner]:
            return _(
                "size {size}: rank {rank} sent {got} bytes to rank {partner}, the algorithm "
                "sends exactly {want} there ({dtype}); send only the half of the block the "
                "partner keeps (or, gathering, your block)"
            ).format(
                size=size,
                rank=rank,
                got=peers[partner][2],
                partner=partner,
                want=want[partner],
                dtype=dtype,
            )
    # One message each way per step: reduce-scatter and allgather meet each partner once, the
    # allreduce twice. The same bytes cut into more messages pay more latency (alpha per message).
    steps = 2 if kind == "allreduce" else 1
    for partner in partners:
        sent, received, _bytes = peers[partner]
        if sent > steps or received > steps:
            return _(
                "size {size}: rank {rank} sent {sent} messages to rank {partner} and received "
                "{received}; the algorithm exchanges one message each way per step ({steps} "
                "with this partner): send the whole half block in one sendrecv, not piece by piece"
            ).format(
                size=size,
                rank=rank,
                sent=sent,
                partner=partner,
                received=received,
                steps=steps,
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
        return _(
            "on {n} ranks rank {rank} sent {messages} messages before its ValueError; "
            "check that comm.world_size is a power of two before the first message"
        ).format(n=world_size, rank=rank, messages=messages)
    if raised:
        return _(
            "on {n} ranks (not a power of two) rank {rank} raised {raised}; raise ValueError "
            "when comm.world_size is not a power of two, before any message"
        ).format(n=world_size, rank=rank, raised=raised)
    return _(
        "on {n} ranks (not a power of two) rank {rank} returned; raise ValueError "
        "when comm.world_size is not a power of two, before any message"
    ).format(n=world_size, rank=rank)
