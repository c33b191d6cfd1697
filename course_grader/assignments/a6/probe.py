"""A6 graded out of the kernel's reach: the engines return data, the grader decides.

The kernel sends the answer (by value) and the source of
:mod:`course_grader.assignments.a6.collect` to its 3 engines (the module itself is hidden:
the kernel and its engines see the kit without ``course_lib.checks``); each rank rebuilds the
inputs from the grader's seed, runs the answer and returns what it produced (Y, the gradients,
a stage's weights, its loss, the order of its passes) and its communicator's counters (the
built-in collectives called, messages and bytes per peer), as data. The grader rebuilds the
inputs from the same seed, computes the one-process reference with torch and judges every rank
with :func:`course_grader.assignments.a6.checks.a6_body`, the notebook's own judges, in its own
process.

The counters are counted inside the student's processes (the engines), so the grader also
counts the bytes between the ranks on the wire, outside the sandbox, and they must agree
(:mod:`course_grader.verdict.wire`): the GPipe exercises' point-to-point messages (A6.3,
A6.4), and the row-parallel exercises' built-ins (A6.1, A6.2) through a model of gloo's rings.
Not closed: the order of a stage's passes is still recorded inside the engines; the ``ast``
guard (no private attributes) is the line there. The engines talk over gloo, so
``torch.distributed`` stays importable (as in A2); the guard still names it.
"""

from __future__ import annotations

from course_grader.verdict.claims import counter_claims, p2p_claims
from course_grader.verdict.engine_probe import collect_spec
from course_grader.verdict.probe import ProbeSpec

__all__ = ["KIT_CUT", "a6_spec"]

_CALLS = {  # exercise: (name, what the engines call)
    "A6.1": ("row_parallel_forward", "(row_parallel_forward,)"),
    "A6.2": ("row_parallel_backward", "(row_parallel_forward, row_parallel_backward)"),
    "A6.3": ("gpipe_step", "gpipe_step"),
    "A6.4": ("gpipe_training", "train_pipeline"),
}


def _row_counters(data: tuple) -> list[tuple]:
    """(built-ins, point-to-point rows) in a row-parallel case's data (a6_collect's _row_parallel:
    Y, used, p2p, and for A6.2 dX, dW, db, used, p2p; _row_training: the 4 tensors, used, p2p)."""
    if len(data) == 3:
        return [(data[1], data[2])]
    return [(data[1], data[2]), (data[6], data[7])] if len(data) == 8 else [(data[4], data[5])]


# Where a case's data holds the built-ins and the point-to-point rows (a6_collect's _pipeline:
# loss, grads, used, p2p, log; _pipeline_training: used, p2p, weights).
_CLAIMS = {
    "A6.1": lambda cases: counter_claims(cases, _row_counters),
    "A6.2": lambda cases: counter_claims(cases, _row_counters),
    "A6.3": lambda cases: p2p_claims(cases, used_at=2, p2p_at=3),
    "A6.4": lambda cases: p2p_claims(cases, used_at=0, p2p_at=1),
}


#: The kit's own answers to A6: the row-parallel layer and the pipeline's step. Its kernel's kit
#: has them only as stubs (course_grader.sandbox.kit_cut); the rest of the kit works as ever.
KIT_CUT = (
    "course_lib.parallel.model_parallel.tensor_parallel:RowParallelLinear.forward",
    "course_lib.parallel.model_parallel.tensor_parallel:reduce_from_parallel",
    "course_lib.parallel.pipeline_parallel.pipeline:pipeline_step",
)


def a6_spec() -> ProbeSpec:
    """A6's probes: the engines run the answers, the grader judges every rank's data."""
    from course_grader.assignments.a6 import checks, collect

    return collect_spec(
        collect,
        _CALLS,
        inputs=checks.a6_cases,
        body=checks.a6_body,
        points=checks.A6_POINTS,
        claims=_CLAIMS,
        kit_cut=KIT_CUT,
    )
