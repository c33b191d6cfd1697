"""A7 graded out of the kernel's reach: the engines return data, the grader decides.

The kernel sends the answer (by value) and the source of
:mod:`course_grader.assignments.a7.collect` to its 3 engines (the module itself is hidden:
the kernel and its engines see the kit without ``course_lib.checks``); each rank rebuilds the
inputs from the grader's seed, runs the answer and returns what it produced (its shard, the
flat weights), the memory ledger (the full-size gradients held during backward, the bytes of
state it keeps) and its communicator's counters (the built-in collectives called, messages and
bytes per peer), as data. The grader rebuilds every
rank's inputs from the same seed, redoes the mean gradients and torch's Adam in one process and
judges every rank with :func:`course_grader.assignments.a7.checks.a7_body`, the notebook's own
judge, in its own process.

The counters are counted inside the student's processes (the engines), so the grader also counts
the bytes between the engines on the wire, outside the sandbox, and an exercise passes only if
the two agree (:func:`a7_claims`, :mod:`course_grader.verdict.wire`). Not closed: the
ledger (the bytes of state an answer keeps) is still measured inside the engines.
"""

from __future__ import annotations

from course_grader.verdict.claims import Claims, p2p_claims
from course_grader.verdict.engine_probe import collect_spec
from course_grader.verdict.probe import ProbeSpec

__all__ = ["KIT_CUT", "a7_claims", "a7_spec"]

_CALLS = {  # exercise: (name, the answer the engines call)
    "A7.1": ("attach_stage2_hooks", "attach_stage2_hooks"),
    "A7.2": ("update_shard", "update_shard"),
}


def a7_claims(cases: list) -> Claims:
    """What the ranks reported sending, summed over the cases: {(rank, peer): (bytes, messages, barriers' bytes)}.

    Each rank's data ends with its built-ins [(name, calls, bytes)] and its point-to-point
    counters, one row per peer: (peer, messages sent, bytes sent, messages received, bytes
    received).
    """
    return p2p_claims(cases, used_at=-2, p2p_at=-1)


#: The kit's own answers to A7: ZeRO stage 2's hooks, reduce-scatter and shard update. Its kernel's
#: kit has them only as stubs (course_grader.sandbox.kit_cut); the rest of the kit works as ever.
KIT_CUT = (
    "course_lib.parallel.sharded.zero:Zero2.attach",
    "course_lib.parallel.sharded.zero:Zero2._hook",
    "course_lib.parallel.sharded.zero:ZeroExchange._reduce_scatter",
    "course_lib.parallel.sharded.zero:ZeroExchange._scatter_into_shard",
)


def a7_spec() -> ProbeSpec:
    """A7's probes: the engines run the answers, the grader judges every rank's data."""
    from course_grader.assignments.a7 import checks, collect, judge

    return collect_spec(
        collect,
        _CALLS,
        inputs=judge.a7_cases,
        body=checks.a7_body,
        points=checks.A7_POINTS,
        claims=dict.fromkeys(_CALLS, a7_claims),
        kit_cut=KIT_CUT,
    )
