"""A2 graded out of the kernel's reach: the engines return data, the grader decides.

The kernel pushes the answer to its engines and has each rank call it on inputs drawn from the
grader's seed; each rank returns what the answer returned, the built-in collectives it called
and its communicator's per-peer counters (messages each way, bytes sent), as data. The grader
re-derives the right sums from the seed and judges each rank with
:func:`course_grader.assignments.a2.judge.judge_rank`, in its own process. A2.1's last case runs
the answer on a real communicator of the first 3 of the 4 ranks (not a power of two): each rank
returns the name of the exception the answer raised there and the messages it sent first, and
the grader asks for a ``ValueError`` before any message
(:func:`course_grader.assignments.a2.judge.judge_not_power_of_two`). A2.3's last cases run the
answer on the same 3 ranks, folded: the engines record the sub-communicators the answer makes
there and return their counters too, renumbered to the 3 ranks, and the grader judges them with
:func:`course_grader.assignments.a2.judge.judge_folded`. The kernel sees the parts of the
kit the engines need (``comm``, ``cluster``, ...) but not ``course_lib.checks``.

The counters are counted inside the student's processes (the engines), so the grader also counts
the bytes on the wire between the engines, outside the sandbox, and each exercise passes only if
the two agree (:func:`a2_claims`, :mod:`course_grader.verdict.wire`): an answer that forges
both the sums (with a built-in allreduce) and the counters it reports fails there.

Kept whole: the engines' side, the grader's judging of their data and the claims it checks on
the wire are one probe; the length is its messages, each a template for translation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_grader.verdict.claims import MAX_RANKS, Claims, ClaimsBuilder, count
from course_grader.verdict.engine_probe import pushed_spec
from course_grader.verdict.probe import ProbeSpec
from course_lib.i18n import _

__all__ = ["a2_claims", "a2_inputs", "a2_spec"]

_ENGINE_SETUP = """\
    def named(c):  # the built-ins a communicator ran, a barrier once per call
        return [n for n, s in c.stats.collectives.items() for _ in range(s.calls if n == "barrier" else 1)]

    def barriers(names):  # a barrier's further calls (the first is among the names)
        return ["barrier"] * max(names.count("barrier") - 1, 0)

    def engine_case(fn, kind, size, dtype, seed):
        import numpy as np
        from IPython import get_ipython
        from course_lib.comm import chunk_bounds

        comm = get_ipython().user_ns["comm"]
        rank, p = comm.rank, comm.world_size
        if kind == "not_power_of_two":  # on a real communicator of p - 1 ranks: a ValueError
            sub = comm.subgroup(list(range(p - 1)))  # every rank calls it; None outside
            if sub is None:
                return -1, p - 1, "", 0
            raised = ""
            try:
                fn(sub, np.zeros(size, dtype=dtype))
            except Exception as exc:
                raised = type(exc).__name__
            sent = sum(s.messages_sent for s in sub.stats.peers.values())
            sent += sum(c.calls for n, c in sub.stats.collectives.items() if n != "barrier")
            return sub.rank, p - 1, raised, sent
        make = lambda r: np.random.default_rng([seed, size, r]).integers(-8, 9, size)
        if kind == "folded":  # the first p - 1 ranks, counting the subgroups the answer makes
            sub = comm.subgroup(list(range(p - 1)))
            if sub is None:
                return -1, p - 1, None, "", [], []
            made, subgroup = [], sub.subgroup
            def recording(ranks):
                core = subgroup(ranks)
                made.append(([int(q) for q in ranks], core))
                return core
            sub.subgroup = recording
            got, raised = None, ""
            try:
                got = fn(sub, make(sub.rank).astype(dtype))
            except Exception as exc:
                raised = type(exc).__name__
            builtin, peers = [], {{}}
            for ranks, c in [(list(range(p - 1)), sub)] + made:
                if c is None:
                    continue
                builtin += named(c)
                for q, s in c.stats.peers.items():
                    old = peers.get(ranks[q], [0, 0, 0])
                    new = [s.messages_sent, s.messages_received, s.bytes_sent]
                    peers[ranks[q]] = [a + b for a, b in zip(old, new)]
            got = None if got is None else np.asarray(got).reshape(-1)
            stats = [[q] + v for q, v in sorted(peers.items())]
            return sub.rank, p - 1, got, raised, sorted(set(builtin)) + barriers(builtin), stats
        x = make(rank).astype(dtype)
        if kind == "allgather":  # on entry rank r holds only its own (finished) chunk
            lo, hi = chunk_bounds(size, p)[rank]
            total = sum(make(r) for r in range(p)).astype(dtype)
            x = np.zeros(size, dtype=dtype)
            x[lo:hi] = total[lo:hi]
        comm.stats.reset()
        got = fn(comm, x)
        names = named(comm)
        builtin = sorted(set(names)) + barriers(names)
        stats = [[q, s.messages_sent, s.messages_received, s.bytes_sent]
                 for q, s in sorted(comm.stats.peers.items())]
        return rank, p, None if got is None else np.asarray(got).reshape(-1), builtin, stats

    cluster.view.push({{"{name}": {name}}}, block=True)  # later answers call it by name
"""
_CALL = (
    'cluster.run(engine_case, {name}, case["kind"], case["size"], case["dtype"], case["seed"],'
    " timeout=60)"
)
# The bytes a pair may carry beyond its reported payload and framing: A2.1's probe makes one
# 3-rank subgroup, A2.3's folded cases 12 (about 600 B each on the pairs of rank 0, measured).
_WIRE_SLACK = {"A2.1": 1024, "A2.2": 64, "A2.3": 8192}
_EXERCISES = {  # exercise: (function, kind)
    "A2.1": ("reduce_scatter_halving", "reduce_scatter"),
    "A2.2": ("allgather_doubling", "allgather"),
    "A2.3": ("rabenseifner_allreduce", "allreduce"),
}


def a2_inputs(kind: str, seed: int) -> list[dict]:
    """A2's cases: every size of ``A2_SIZES`` in float32 and float64, on the grader's seed;
    A2.1's last case runs the answer on 3 ranks, where it must raise ``ValueError``; A2.3's
    last cases run it on 3 ranks, folded."""
    from course_grader.assignments.a2.checks import A2_SIZES, FOLDED, NOT_POWER_OF_TWO

    cases = [
        {"kind": kind, "size": size, "dtype": dtype, "seed": seed}
        for size in A2_SIZES
        for dtype in ("float32", "float64")
    ]
    if kind == "reduce_scatter":
        cases.append({"kind": NOT_POWER_OF_TWO, "size": 10, "dtype": "float32", "seed": seed})
    if kind == "allreduce":
        cases += [dict(case, kind=FOLDED) for case in cases]
    return cases


def _judge_folded(case: dict, ranks: Any) -> int:
    """Raise AssertionError with the first problem of the 3-rank folded run; return 3."""
    from course_grader.assignments.a2.judge import judge_folded

    if not isinstance(ranks, list) or not ranks:
        raise AssertionError(_("the engines returned no result"))
    members = [r for r in ranks if isinstance(r, tuple) and len(r) == 6 and int(r[0]) >= 0]
    world_size = len(ranks) - 1
    if sorted(int(r[0]) for r in members) != list(range(world_size)):
        raise AssertionError(_("the engines' results do not come one from each rank"))
    size, dtype, seed = case["size"], case["dtype"], case["seed"]
    inputs = [
        np.random.default_rng([seed, size, r]).integers(-8, 9, size).astype(dtype)
        for r in range(world_size)
    ]
    for rank, p, got, raised, builtin, stats in sorted(members, key=lambda r: int(r[0])):
        if got is not None and np.asarray(got).dtype.kind not in "biuf":
            raise AssertionError(
                _("rank {rank} returned {got}, not an array").format(rank=int(rank), got=got)
            )
        peers = {
            int(q): (int(sent), int(received), int(nbytes)) for q, sent, received, nbytes in stats
        }
        raised = raised if isinstance(raised, str) else "<not a name>"
        why = judge_folded(
            size, dtype, int(rank), int(p), inputs, got, raised, [str(b) for b in builtin], peers
        )
        if why:
            raise AssertionError(why)
    return world_size


def _judge_not_power_of_two(ranks: Any) -> int:
    """Raise AssertionError unless every rank of the 3-rank run raised ValueError unsent."""
    from course_grader.assignments.a2.judge import judge_not_power_of_two

    if not isinstance(ranks, list) or not ranks:
        raise AssertionError(_("the engines returned no result"))
    members = [r for r in ranks if isinstance(r, tuple) and len(r) == 4 and int(r[0]) >= 0]
    world_size = len(ranks) - 1
    if sorted(int(r[0]) for r in members) != list(range(world_size)):
        raise AssertionError(_("the engines' results do not come one from each rank"))
    for rank, p, raised, sent in members:
        raised = raised if isinstance(raised, str) else "<not a name>"
        why = judge_not_power_of_two(int(rank), int(p), raised, int(np.asarray(sent)))
        if why:
            raise AssertionError(why)
    return world_size


def _judge_case(case: dict, ranks: Any) -> int:
    """Raise AssertionError with the first rank's problem; return the world size."""
    from course_grader.assignments.a2.checks import FOLDED, NOT_POWER_OF_TWO
    from course_grader.assignments.a2.judge import judge_rank

    if case["kind"] == NOT_POWER_OF_TWO:
        return _judge_not_power_of_two(ranks) + 1
    if case["kind"] == FOLDED:
        return _judge_folded(case, ranks) + 1
    if not isinstance(ranks, list) or not ranks:
        raise AssertionError(_("the engines returned no result"))
    world_size = int(ranks[0][1])
    if world_size < 2 or world_size & (world_size - 1):
        raise AssertionError(
            _("the check needs a power-of-two number of engines, not {n}; start 4").format(
                n=world_size
            )
        )
    if sorted(int(r[0]) for r in ranks) != list(range(world_size)):
        raise AssertionError(_("the engines' results do not come one from each rank"))
    size, dtype, seed = case["size"], case["dtype"], case["seed"]
    inputs = [
        np.random.default_rng([seed, size, r]).integers(-8, 9, size) for r in range(world_size)
    ]
    reference = sum(inputs).astype(dtype)  # small integers: every summation order is exact
    for rank, p, got, builtin, stats in ranks:
        peers = {
            int(q): (int(sent), int(received), int(nbytes)) for q, sent, received, nbytes in stats
        }
        if got is not None and np.asarray(got).dtype.kind not in "biuf":
            raise AssertionError(
                _("rank {rank} returned {got}, not an array").format(rank=int(rank), got=got)
            )
        why = judge_rank(
            case["kind"],
            size,
            dtype,
            int(rank),
            int(p),
            reference,
            got,
            [str(b) for b in builtin],
            peers,
        )
        if why:
            raise AssertionError(why)
    return world_size


def _body(exercise: str, answer: Any, seed: int) -> str:
    """Judge the replayed answer on every case of ``exercise``; return the PASS detail."""
    from course_grader.assignments.a2.checks import A2_SIZES

    kind = _EXERCISES[exercise][1]
    world_size = 0
    for case in a2_inputs(kind, seed):
        world_size = _judge_case(case, answer(case))
    if kind == "reduce_scatter":
        return _(
            "{n} ranks, partners r XOR 2^k, {sizes} sizes, float32 and float64; ValueError "
            "on {m} ranks"
        ).format(n=world_size, sizes=len(A2_SIZES), m=world_size - 1)
    if kind == "allreduce":
        return _(
            "{n} ranks, partners r XOR 2^k, {sizes} sizes, float32 and float64; {m} ranks "
            "folded into {k}"
        ).format(n=world_size, sizes=len(A2_SIZES), m=world_size - 1, k=world_size // 2)
    return _("{n} ranks, partners r XOR 2^k, {sizes} sizes, float32 and float64").format(
        n=world_size, sizes=len(A2_SIZES)
    )


def _rank(value: Any) -> int:
    """A rank as reported: a whole number, -1 for an engine outside the subgroup (ValueError else)."""
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iu":
        value = value.reshape(()).item()
    if isinstance(value, (int, np.integer)) and int(value) == -1:
        return -1
    return count(value, "a rank", MAX_RANKS - 1)


def a2_claims(cases: list) -> Claims:
    """What the ranks reported sending, summed over the cases: {(rank, peer): (bytes, messages, barriers' bytes)}.

    A rank's per-peer line is (peer, messages sent, messages received, bytes sent), and its
    built-ins name a barrier once per call; the folded cases number their 3 ranks as the
    engines' first 3, and the 3-rank ``ValueError`` case reports messages only (it must send none).
    """
    claims = ClaimsBuilder()
    for ranks in cases:
        for line in ranks:
            if not isinstance(line, tuple) or len(line) not in (4, 5, 6):
                raise ValueError("a rank's line is not (rank, size, ..., built-ins, peers)")
            if _rank(line[0]) < 0:
                continue  # an engine outside the subgroup
            if len(line) == 4:  # not a power of two: (rank, p, raised, messages sent)
                if count(line[3], "a message count"):
                    raise ValueError("messages without a peer")
                continue
            rank, world_size, builtin, stats = count(line[0]), count(line[1]), line[-2], line[-1]
            if len(stats) > MAX_RANKS or len(builtin) > 64:
                raise ValueError(f"rank {rank} reported more peers or calls than there are")
            for peer, sent, _received, nbytes in stats:
                claims.sent(rank, count(peer), count(nbytes), count(sent))
            claims.barriers(rank, world_size, [str(b) for b in builtin].count("barrier"))
    return claims.claims


def a2_spec() -> ProbeSpec:
    """A2's probes: the engines run the answers, the grader judges every rank's data."""
    from course_grader.assignments.a2.checks import A2_POINTS, KIT_CUT

    return pushed_spec(
        _EXERCISES,
        _CALL,
        _ENGINE_SETUP,
        inputs=a2_inputs,
        body=_body,
        points=A2_POINTS,
        claims=a2_claims,
        wire_slack=_WIRE_SLACK,
        kit_cut=KIT_CUT,
    )
