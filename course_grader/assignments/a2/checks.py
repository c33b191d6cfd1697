"""Checks of assignment A2 (Rabenseifner's allreduce: halving reduce-scatter, doubling allgather).

The student's function is sent to every engine and called there with the engine's
communicator (``comm``, made by :func:`course_lib.comm.setup_communicators`). Its result is
compared with the backend's own built-in reduce-scatter / allreduce on the same inputs. Inputs are
small integers stored as floats, so every summation order gives the same exact answer and verdicts
are deterministic.

The right numbers are not enough: the built-in collective gives them too, and so does the ring of
:mod:`course_lib.collectives` (which sends the same total bytes as Rabenseifner's algorithm). So
the check also reads the communicator's per-peer counters: no built-in collective may be called,
rank ``r`` may talk only to its partners ``r XOR 2^k``, and to each partner it must send exactly
the bytes the algorithm sends there (:func:`rabenseifner_bytes_sent`; Thakur, Rabenseifner &
Gropp 2005, "Optimization of collective communication operations in MPICH").

A2.1 also asks for a ``ValueError`` when the world size is not a power of two (the halving
pairs ``r`` with ``r XOR d``, which does not exist on 3 ranks; MPICH folds the extra ranks in
first). The check runs the answer on a real 3-rank communicator (a subgroup of the engines'):
every rank must raise ``ValueError`` before it sends anything
(:func:`judge_not_power_of_two`).

A2.3 is the allreduce on any number of ranks, with MPICH's folding (Thakur, Rabenseifner &
Gropp 2005, section 4.4): with ``N' = 2^floor(log2 N)`` and ``r = N - N'``, each even rank of the
first ``2r`` sends its whole buffer to the next odd rank and sits out, the ``N'`` others run
halving and doubling on a sub-communicator, and each odd rank sends the sum back. The check runs
it on a real 3-rank communicator too, records the sub-communicators the answer makes there, and
counts their traffic in the 3-rank numbering (:func:`folded_traffic`, :func:`judge_folded`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.checks.verdict import Verdict, run_check

__all__ = [
    "A2_POINTS",
    "A2_SIZES",
    "check_allgather_doubling",
    "check_rabenseifner_allreduce",
    "check_reduce_scatter_halving",
    "folded_traffic",
    "judge_folded",
    "judge_not_power_of_two",
    "judge_rank",
    "rabenseifner_bytes_sent",
    "rabenseifner_partners",
]

A2_POINTS = {"A2.1": 3.0, "A2.2": 2.0, "A2.3": 3.0}
A2_SIZES = (10, 1001, 4096)  # uneven chunks (3, 3, 2, 2 on 4 ranks), not divisible, even
NOT_POWER_OF_TWO = "not_power_of_two"  # A2.1's last case: the answer on the first 3 ranks
FOLDED = "folded"  # A2.3's cases on the first 3 ranks: folding, then halving and doubling


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


def run_not_power_of_two(comm: Any, fn: Callable) -> tuple[int, str, int]:
    """Run ``fn`` on a communicator of this engine's first ``world_size - 1`` ranks.

    Every rank of ``comm`` must call it (making the subgroup is collective). Returns
    (rank in the subgroup or -1 outside it, the exception's name or "", messages sent and
    collectives called there).
    """
    import numpy as np

    sub = comm.subgroup(list(range(comm.world_size - 1)))
    if sub is None:
        return -1, "", 0
    raised = ""
    try:
        fn(sub, np.zeros(10, dtype=np.float32))
    except Exception as exc:  # noqa: BLE001 - any exception is data for the judge
        raised = type(exc).__name__
    stats = sub.stats
    messages = sum(s.messages_sent for s in stats.peers.values())
    messages += sum(c.calls for name, c in stats.collectives.items() if name != "barrier")
    return sub.rank, raised, messages


def run_folded(comm: Any, fn: Callable, x: Any) -> tuple[int, Any, str, list[str], dict]:
    """Run ``fn`` on a communicator of this engine's first ``world_size - 1`` ranks, counting.

    Every rank of ``comm`` must call it. The sub-communicators ``fn`` makes there are recorded, so
    their traffic counts too, renumbered to the ``world_size - 1`` ranks. Returns (rank there or
    -1 outside, what ``fn`` returned, the exception's name or "", built-ins called,
    {peer: (messages sent, received, bytes sent)}).
    """
    import numpy as np

    sub = comm.subgroup(list(range(comm.world_size - 1)))
    if sub is None:
        return -1, None, "", [], {}
    made: list = []
    subgroup = sub.subgroup

    def recording(ranks: Any) -> Any:  # the answer's core: its counters are read afterwards
        core = subgroup(ranks)
        made.append(([int(q) for q in ranks], core))
        return core

    sub.subgroup = recording
    got, raised = None, ""
    try:
        got = fn(sub, x)
    except Exception as exc:  # noqa: BLE001 - any exception is data for the judge
        raised = type(exc).__name__
    builtin, peers = set(sub.stats.collectives), {}
    for ranks, c in [(list(range(sub.world_size)), sub)] + made:
        if c is None:
            continue
        builtin |= set(c.stats.collectives)
        for q, s in c.stats.peers.items():
            old = peers.get(ranks[q], (0, 0, 0))
            new = (s.messages_sent, s.messages_received, s.bytes_sent)
            peers[ranks[q]] = tuple(a + b for a, b in zip(old, new, strict=True))
    got = None if got is None else np.asarray(got).reshape(-1).copy()
    return sub.rank, got, raised, sorted(builtin), peers


def _run_case(fn: Callable, kind: str, size: int, dtype: str, comm_name: str) -> str:
    """Run on an engine: call the student's ``fn`` on this rank's input; return "" or what is wrong."""
    import numpy as np
    from IPython import get_ipython

    from course_grader.assignments.a2.checks import (
        judge_folded,
        judge_not_power_of_two,
        judge_rank,
        run_folded,
        run_not_power_of_two,
    )
    from course_lib.comm.buffers import chunk_bounds

    comm = get_ipython().user_ns[comm_name]
    rank, world_size = comm.rank, comm.world_size
    if kind == NOT_POWER_OF_TWO:
        sub_rank, raised, messages = run_not_power_of_two(comm, fn)
        if sub_rank < 0:
            return ""
        return judge_not_power_of_two(sub_rank, world_size - 1, raised, messages)
    if kind == FOLDED:  # every rank's input, so the judge can name a lost contribution
        inputs = [np.random.default_rng([size, q]).integers(-8, 9, size) for q in range(3)]
        inputs = [x.astype(dtype) for x in inputs]
        x = inputs[rank].copy() if rank < 3 else np.zeros(size, dtype=dtype)
        sub_rank, got, raised, builtin, peers = run_folded(comm, fn, x)
        if sub_rank < 0:
            return ""
        return judge_folded(size, dtype, sub_rank, 3, inputs, got, raised, builtin, peers)
    rng = np.random.default_rng([size, rank])
    x = rng.integers(-8, 9, size).astype(dtype)
    reference = np.asarray(comm.allreduce(x.copy())).reshape(-1)
    if kind == "allgather":  # on entry rank r holds only its own (finished) chunk
        lo, hi = chunk_bounds(size, world_size)[rank]
        x = np.zeros(size, dtype=dtype)
        x[lo:hi] = reference[lo:hi]
    comm.stats.reset()
    got = fn(comm, x)
    builtin = list(comm.stats.collectives)
    peers = {
        p: (s.messages_sent, s.messages_received, s.bytes_sent) for p, s in comm.stats.peers.items()
    }
    return judge_rank(kind, size, dtype, rank, world_size, reference, got, builtin, peers)


def _check(
    exercise: str, name: str, fn: Callable, cluster: Any, kind: str, comm_name: str, verbose: bool
) -> Verdict:
    def body() -> str:
        world_size = cluster.world_size
        assert world_size >= 2 and world_size & (world_size - 1) == 0, (
            f"the check needs a power-of-two number of engines, not {world_size}; start 4"
        )
        # The function runs on the engines; under its own name there, later answers can call it.
        cluster.view.push({fn.__name__: fn}, block=True)
        for size in A2_SIZES:
            for dtype in ("float32", "float64"):
                results = cluster.run(_run_case, fn, kind, size, dtype, comm_name, timeout=60)
                for why in results:
                    assert not why, why
        if kind == "reduce_scatter":  # A2.1 also raises ValueError unless N is a power of two
            for why in cluster.run(_run_case, fn, NOT_POWER_OF_TWO, 0, "", comm_name, timeout=60):
                assert not why, why
            return (
                f"{world_size} ranks, partners r XOR 2^k, {len(A2_SIZES)} sizes, float32 and "
                f"float64; ValueError on {world_size - 1} ranks"
            )
        if kind == "allreduce":  # A2.3 also runs on 3 ranks, folded
            for size in A2_SIZES:
                for dtype in ("float32", "float64"):
                    for why in cluster.run(
                        _run_case, fn, FOLDED, size, dtype, comm_name, timeout=60
                    ):
                        assert not why, why
            return (
                f"{world_size} ranks, partners r XOR 2^k, {len(A2_SIZES)} sizes, float32 and "
                "float64; 3 ranks folded into 2"
            )
        return f"{world_size} ranks, partners r XOR 2^k, {len(A2_SIZES)} sizes, float32 and float64"

    return run_check(exercise, name, body, max_points=A2_POINTS[exercise], verbose=verbose)


def check_reduce_scatter_halving(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A2.1: ``fn(comm, x)`` returns ``x`` with chunk ``rank`` summed, by recursive halving."""
    return _check(
        "A2.1", "reduce_scatter_halving", fn, cluster, "reduce_scatter", comm_name, verbose
    )


def check_allgather_doubling(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A2.2: ``fn(comm, x)`` fills every chunk of ``x`` from its owner, by recursive doubling."""
    return _check("A2.2", "allgather_doubling", fn, cluster, "allgather", comm_name, verbose)


def check_rabenseifner_allreduce(
    fn: Callable, cluster: Any, *, comm_name: str = "comm", verbose: bool = True
) -> Verdict:
    """A2.3: ``fn(comm, x)`` returns the sum over ranks on any N: folding, halving, doubling."""
    return _check("A2.3", "rabenseifner_allreduce", fn, cluster, "allreduce", comm_name, verbose)
