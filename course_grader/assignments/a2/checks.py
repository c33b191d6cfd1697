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
the bytes the algorithm sends there
(:func:`~course_grader.assignments.a2.judge.rabenseifner_bytes_sent`; Thakur, Rabenseifner &
Gropp 2005, "Optimization of collective communication operations in MPICH").

A2.1 also asks for a ``ValueError`` when the world size is not a power of two (the halving
pairs ``r`` with ``r XOR d``, which does not exist on 3 ranks; MPICH folds the extra ranks in
first). The check runs the answer on a real 3-rank communicator (a subgroup of the engines'):
every rank must raise ``ValueError`` before it sends anything
(:func:`~course_grader.assignments.a2.judge.judge_not_power_of_two`).

A2.3 is the allreduce on any number of ranks, with MPICH's folding (Thakur, Rabenseifner &
Gropp 2005, section 4.4): with ``N' = 2^floor(log2 N)`` and ``r = N - N'``, each even rank of the
first ``2r`` sends its whole buffer to the next odd rank and sits out, the ``N'`` others run
halving and doubling on a sub-communicator, and each odd rank sends the sum back. The check runs
it on a real 3-rank communicator too, records the sub-communicators the answer makes there, and
counts their traffic in the 3-rank numbering (``folded_traffic``, ``judge_folded``).

The model of the wire and the judges are :mod:`course_grader.assignments.a2.judge`; this module
runs the answer on the engines and holds the check cells.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.checks.verdict import Verdict, run_check
from course_lib.i18n import _

__all__ = [
    "A2_POINTS",
    "KIT_CUT",
    "A2_SIZES",
    "FOLDED",
    "NOT_POWER_OF_TWO",
    "check_allgather_doubling",
    "check_rabenseifner_allreduce",
    "check_reduce_scatter_halving",
    "run_folded",
    "run_not_power_of_two",
]

A2_POINTS = {"A2.1": 3.0, "A2.2": 2.0, "A2.3": 3.0}
#: The kit's own answers to A2: the reduce-scatter, allgather and allreduce by recursive halving
#: and doubling. Its kernel's kit has them only as stubs (course_grader.sandbox.kit_cut); the rest
#: of the kit works as ever.
KIT_CUT = (
    "course_lib.collectives.tree:doubling_schedule",
    "course_lib.collectives.tree:recursive_doubling_allreduce",
)
A2_SIZES = (10, 1001, 4096)  # uneven chunks (3, 3, 2, 2 on 4 ranks), not divisible, even
NOT_POWER_OF_TWO = "not_power_of_two"  # A2.1's last case: the answer on the first 3 ranks
FOLDED = "folded"  # A2.3's cases on the first 3 ranks: folding, then halving and doubling


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

    from course_grader.assignments.a2.checks import run_folded, run_not_power_of_two
    from course_grader.assignments.a2.judge import (
        judge_folded,
        judge_not_power_of_two,
        judge_rank,
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
        assert world_size >= 2 and world_size & (world_size - 1) == 0, _(
            "the check needs a power-of-two number of engines, not {n}; start 4"
        ).format(n=world_size)
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
            return _(
                "{n} ranks, partners r XOR 2^k, {sizes} sizes, float32 and float64; ValueError "
                "on {m} ranks"
            ).format(n=world_size, sizes=len(A2_SIZES), m=world_size - 1)
        if kind == "allreduce":  # A2.3 also runs on 3 ranks, folded
            for size in A2_SIZES:
                for dtype in ("float32", "float64"):
                    for why in cluster.run(
                        _run_case, fn, FOLDED, size, dtype, comm_name, timeout=60
                    ):
                        assert not why, why
            return _(
                "{n} ranks, partners r XOR 2^k, {sizes} sizes, float32 and float64; {m} ranks "
                "folded into {k}"
            ).format(n=world_size, sizes=len(A2_SIZES), m=3, k=2)
        return _("{n} ranks, partners r XOR 2^k, {sizes} sizes, float32 and float64").format(
            n=world_size, sizes=len(A2_SIZES)
        )

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
