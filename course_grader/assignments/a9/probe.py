"""A9 graded out of the kernel's reach: the kernel and the engines return data, the grader decides.

A9.1: the kernel calls the student's ``online_softmax_update`` on states and blocks drawn from
the grader's seed and returns the new states; the grader holds them against the softmax over
every key so far (:mod:`course_grader.assignments.a9.online`), which the kernel cannot see
(``course_grader`` is hidden there). A9.2: the kernel sends the answer (by value) and the
source of :mod:`course_grader.assignments.a9.collect` to its 3 engines; each rank rebuilds the
sequence from the grader's seed, runs the answer on its block and returns its output and its
communicator's counters, as data; the grader computes full causal attention itself and judges
every rank with :func:`course_grader.assignments.a9.checks.a9_body`, the notebook's own judge.

The counters are counted inside the student's processes (the engines), so the grader also counts
the bytes between the engines on the wire, outside the sandbox, and A9.2 passes only if the two
agree (:mod:`course_grader.verdict.wire`).
"""

from __future__ import annotations

from course_grader.verdict.claims import Claims, p2p_claims
from course_grader.verdict.engine_probe import collect_spec
from course_grader.verdict.probe import ExerciseProbe, ProbeSpec

__all__ = ["a9_claims", "a9_spec"]

#: The kernel's call of A9.1: the grader's arrays as torch tensors, the new state back.
_UPDATE = (
    'online_softmax_update(*[torch.from_numpy(case[k].copy()) for k in ("m", "ell", "acc", '
    '"s", "v")])'
)


def a9_claims(cases: list) -> list[Claims]:
    """What the ranks reported sending, summed over the cases (data: output, built-ins, rows)."""
    return p2p_claims(cases, used_at=-2, p2p_at=-1)


def a9_spec() -> ProbeSpec:
    """A9's probes: the kernel and the engines run the answers, the grader judges their data."""
    from course_grader.assignments.a9 import checks, collect

    ring = collect_spec(
        collect,
        {"A9.2": ("ring_attention_forward", "ring_attention_forward")},
        inputs=checks.a9_cases,
        body=checks.a9_body,
        points=checks.A9_POINTS,
        claims={"A9.2": a9_claims},
    )
    update = ExerciseProbe(
        checks.online_cases, _UPDATE, checks.check_online_softmax_update, "    import torch\n"
    )
    return ProbeSpec("", {"A9.1": update, **ring.exercises}, blocked=False, kit=True)
