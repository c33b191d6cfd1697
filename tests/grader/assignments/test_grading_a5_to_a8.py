"""A5-A9 graded end to end by the grader: source full, stub nothing, each mistake only its exercise."""

from __future__ import annotations

import numpy as np
import pytest
from grading_notebooks import (
    LIMITS,
)
from grading_notebooks import (
    points_of as _points,
)
from grading_notebooks import (
    released_notebook as _released,
)
from grading_notebooks import (
    source_notebook as _source,
)
from grading_notebooks import (
    with_answer as _with_answer,
)

from course_grader.cells import answer_id
from course_grader.grade import grade_notebook
from course_lib.comm import chunk_bounds

# -- grading A5 (real engines: training inside the compressed exchange) --------------------------

A5_FULL = {"A5.1": 2.0, "A5.2": 1.0, "A5.3": 2.0, "A5.4": 2.0, "A5.5": 1.0, "A5.6": 2.0}


@pytest.mark.slow
def test_a5_source_answers_get_their_points_and_a_stub_loses_its_own_and_its_users():
    # One grading run (it trains twice on 2 engines): the source's answers everywhere but A5.3,
    # which keeps the released stub. A5.5's block top-k calls it, so A5.5 fails too; A5.6 trains
    # with block int8 only and passes, so training through the exchange is graded as well.
    source = _source("A5_compression")
    submission = _released("A5_compression")
    for cell in source.cells:
        if answer_id(cell) and answer_id(cell) != "A5.3":
            submission = _with_answer(submission, answer_id(cell), cell.source)
    rows = grade_notebook("partial", "A5", source, submission, LIMITS)
    assert _points(rows) == dict(A5_FULL, **{"A5.3": 0.0, "A5.5": 0.0}), rows
    reasons = {row.exercise: row.reason for row in rows}
    for exercise in ("A5.3", "A5.5"):
        assert reasons[exercise].startswith("FAIL (not implemented yet: Exercise A5.3: "), reasons


A6_FULL = {"A6.1": 2.0, "A6.2": 3.0, "A6.3": 3.0, "A6.4": 2.0}
A7_FULL = {"A7.1": 6.0, "A7.2": 4.0}
A8_FULL = {"A8.1": 3.0, "A8.2": 3.0, "A8.3": 4.0}
A9_FULL = {"A9.1": 4.0, "A9.2": 6.0}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("assignment", "name", "full"),
    [
        ("A5", "A5_compression", A5_FULL),
        ("A6", "A6_model_pipeline", A6_FULL),
        ("A7", "A7_zero_stage2", A7_FULL),
        ("A8", "A8_choosing_a_strategy", A8_FULL),
        ("A9", "A9_ring_attention", A9_FULL),
    ],
    ids=["a5", "a6", "a7", "a8", "a9"],
)
def test_graded_by_the_grader_source_full_stub_nothing_each_mistake_only_its_exercise(
    assignment, name, full
):
    # Judged outside the kernel (course_grader.assignments.a5.probe / a6 / a7 / a8 / a9), on a fresh seed per run.
    from course_grader.registry import probe_spec
    from course_grader.selftest.attacks import submissions

    mistakes = getattr(submissions, f"{assignment}_MISTAKES")
    source = _source(name)
    assert probe_spec(source) is not None  # the probes, not the in-kernel checks
    rows = grade_notebook("teacher", assignment, source, source, LIMITS)
    assert _points(rows) == full, rows
    rows = grade_notebook("blank", assignment, source, _released(name), LIMITS)
    assert _points(rows) == dict.fromkeys(full, 0.0), rows
    assert all(r.reason.startswith("FAIL (not implemented yet: Exercise ") for r in rows), rows
    if submissions.typical_mistakes_are_the_routes(assignment):
        return  # graded once, with the routes' prefixes: test_grading_attacks.py's routes test
    answers = {answer_id(c): c.source for c in source.cells if answer_id(c)}
    submission = source
    for exercise, old, new, _ in mistakes:
        edited = submissions.edit_answer(answers[exercise], old, new)
        submission = _with_answer(submission, exercise, edited)
    rows = grade_notebook("typical", assignment, source, submission, LIMITS)
    assert _points(rows) == dict(full, **{exercise: 0.0 for exercise, *_ in mistakes}), rows
    reasons = {row.exercise: row.reason for row in rows}
    for exercise, _, _, reason in mistakes:
        assert reasons[exercise].startswith("FAIL (") and reason in reasons[exercise], reasons


def test_the_grader_judges_a5_a6_and_a7_from_probe_lines_alone():
    # The grader's half, no kernel: lines as a probe prints them, for the grader's seed.
    import json

    from course_grader.assignments.a5.checks import encode_cases
    from course_grader.assignments.a5.exchange import reference_encode
    from course_grader.assignments.a5.probe import a5_spec
    from course_grader.assignments.a6.probe import a6_spec
    from course_grader.verdict.probe import MARK, _encode, judge

    def line(values: list) -> str:
        return MARK + json.dumps([{"value": v} for v in values])

    def pair(q, scales) -> dict:
        return {"tuple": [_encode(q), _encode(scales)]}

    seed = 11
    right = [reference_encode(c["g"], c["block"]) for c in encode_cases(seed)]
    assert judge(a5_spec(), "A5.1", seed, line([pair(*r) for r in right])) == (True, "PASS")
    own = [reference_encode(g, b) for g, b in ((c["g"], c["block"]) for c in encode_cases(None))]
    passed, reason = judge(a5_spec(), "A5.1", seed, line([pair(*r) for r in own]))
    assert not passed and "expected max|g|" in reason, reason  # the notebook's inputs' answers
    a6_two_ranks = line([{"list": [{"tuple": [_encode(np.array(r)), _encode(np.array(2)),
                                             {"tuple": []}]} for r in range(2)]}])  # fmt: skip
    passed, reason = judge(a6_spec(), "A6.1", seed, a6_two_ranks)
    assert (passed, reason) == (False, "FAIL (the check needs 3 engines, not 2)")

    # A7.2 from weights and counters made here: the grader's seed passes, stale shards fail.
    from course_grader.assignments.a7.judge import _adam, a7_cases
    from course_grader.assignments.a7.probe import a7_spec

    def a7_ranks(case: dict, gathered: bool) -> dict:
        from course_grader.assignments.a7.collect import bucket

        m, n = case["m"], 3
        want, before = _adam(m, case["seed"]).numpy(), bucket(m, case["seed"]).numpy()
        ranks = []
        for r, (lo, hi) in enumerate(chunk_bounds(m, n)):
            weights = want.copy() if gathered else before.copy()
            weights[lo:hi] = want[lo:hi]
            call = [{"str": "allgather"}, _encode(np.array(3)), _encode(np.array(48))]
            used = {"list": [{"tuple": call}]}
            held = _encode(np.array(12 * (hi - lo) + 4))
            data = {"tuple": [_encode(weights), held, used, _encode(np.zeros((0, 5), np.int64))]}
            ranks.append({"tuple": [_encode(np.array(r)), _encode(np.array(n)), data]})
        return {"list": ranks}

    cases = a7_cases("A7.2", seed)
    ok = judge(a7_spec(), "A7.2", seed, line([a7_ranks(c, True) for c in cases]))
    assert ok[0], ok
    passed, reason = judge(a7_spec(), "A7.2", seed, line([a7_ranks(c, False) for c in cases]))
    assert not passed and "are the weights before the step" in reason, reason
