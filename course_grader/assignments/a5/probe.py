"""A5 graded out of the kernel's reach: the kernel calls the answers, the grader decides.

A5.1–A5.3: the kernel calls the student's functions on gradients drawn from the grader's seed
and returns the arrays; the grader compares them bit for bit with
:mod:`course_grader.assignments.a5.exchange`, which the kernel cannot see (``course_lib.checks``
is hidden there). A5.4–A5.6: the kernel runs the collectors of
:mod:`course_grader.assignments.a5.collect`, shipped as source text into the probe cell (the
module itself stays hidden), and returns what each call sent, the compressors' payload bytes and
decoded values, and what the two training runs measured; the grader judges them with
:mod:`course_grader.assignments.a5.exchange`'s bodies, the notebook's own judges.

A5.6's runs report each rank's counts (``DataParallelResult.counters``), held against the bytes
on the wire outside the sandbox (:mod:`course_grader.verdict.wire`). Not closed: its other
numbers (the two runs' test accuracy, the bytes each step sent before coding, whether the
replicas agree) are measured in the student's processes (the engines train), so an answer that
forges all of them is not caught here; the ``ast`` guard is the line there. A5.4's probe carries the block formats of its inner compressors, so an
answer cell that runs after it could read them; A5.1–A5.3 are decided by then. The engines
train over gloo, so torch stays importable (as in A2); the guard still names it.
"""

from __future__ import annotations

import base64
import inspect
from collections.abc import Callable

from course_grader.verdict.claims import Claims, ClaimsBuilder
from course_grader.verdict.probe import ExerciseProbe, ProbeSpec
from course_lib.checks.verdict import Verdict, run_check

__all__ = ["KIT_CUT", "a5_spec", "training_claims"]

#: Bytes the pair of ranks may carry beyond A5.6's claims: the first run makes the engines'
#: communicators (the rendezvous and gloo's connections, between the two engines).
_TRAINING_SLACK = 8192


def training_claims(cases: list) -> list[Claims]:
    """What A5.6's two runs reported sending: each rank's counts of the set-up and the steps."""
    claims = ClaimsBuilder()
    for result in cases:
        for counters in result[6]:
            claims.training_run(counters)
    return claims.alternatives()


_COLLECT = (
    '    ns = {{"__name__": "course_probe_a5"}}  # the collectors, as source: the module is hidden\n'
    '    exec(base64.b64decode("{source}").decode(), ns)\n'
)


def _judged(exercise: str, name: str, body: Callable) -> Callable[..., Verdict]:
    """A check over the replayed answer: ``body(answer, seed)`` is the notebook's own judge."""
    from course_grader.assignments.a5.checks import A5_POINTS

    def check(answer: Callable, *, verbose: bool = False, seed: int = 0) -> Verdict:
        return run_check(
            exercise,
            name,
            lambda: body(answer, seed),
            max_points=A5_POINTS[exercise],
            verbose=verbose,
        )

    return check


#: The kit's own answers to A5: int8 encoding and decoding, top-k, error feedback. Its kernel's kit
#: has them only as stubs (course_grader.sandbox.kit_cut); the rest of the kit works as ever.
KIT_CUT = (
    "course_lib.compression.int8:int8_encode",
    "course_lib.compression.int8:int8_decode",
    "course_lib.compression.sparse:TopK.compress",
    "course_lib.compression.error_feedback:ErrorFeedback.compress",
)


def a5_spec() -> ProbeSpec:
    """A5's probes: the kernel returns arrays and counts, the grader judges them."""
    from course_grader.assignments.a5 import checks as a5
    from course_grader.assignments.a5 import collect as a5_collect
    from course_grader.assignments.a5 import exchange as a5_exchange

    source = base64.b64encode(inspect.getsource(a5_collect).encode()).decode()
    collect = _COLLECT.format(source=source)
    return ProbeSpec(
        "",  # the set-up cell imports no checks: it stays
        {
            "A5.1": ExerciseProbe(
                a5.encode_cases,
                'block_int8_encode(case["g"].copy(), case["block"])',
                a5.check_block_int8_encode,
            ),
            "A5.2": ExerciseProbe(
                a5.decode_cases,
                'block_int8_decode(case["q"].copy(), case["scales"].copy(), case["block"])',
                a5.check_block_int8_decode,
            ),
            "A5.3": ExerciseProbe(
                a5.topk_cases,
                'block_topk(case["g"].copy(), case["block"], case["k"])',
                a5.check_block_topk,
            ),
            "A5.4": ExerciseProbe(
                a5_exchange.error_feedback_cases,
                'ns["collect_error_feedback"](WithErrorFeedback, case)',
                _judged("A5.4", "error_feedback", a5_exchange.error_feedback_body),
                collect,
            ),
            "A5.5": ExerciseProbe(
                a5_exchange.compressor_cases,
                'ns["collect_compressor"](BlockInt8(case["block"]) if case["kind"] == "int8" '
                'else BlockTopK(case["block"], case["k"]), case["g"], case["stage"])',
                _judged("A5.5", "compressors", a5_exchange.compressors_body),
                collect,
            ),
            "A5.6": ExerciseProbe(
                lambda seed: [{}],  # the training run's inputs are the kit's (digits, seed 1)
                'ns["collect_training"](a5_compressor, cluster)',
                _judged("A5.6", "training", lambda answer, seed: a5_exchange.training_body(answer)),
                collect,
                claims=training_claims,
                wire_slack=_TRAINING_SLACK,
            ),
        },
        # The engines train over gloo (torch.distributed): torch stays importable, and the kit
        # is shown without its checks (the references).
        blocked=False,
        kit=True,
        kit_cut=KIT_CUT,
    )
