"""Lecture 10's checks: the instructor's answers pass; the notebook's stubs, the library's
schedule and balancer, and plausible mistakes fail with a reason."""

from __future__ import annotations

import pytest
from lecture10_answers import my_1f1b, my_balance
from lecture_notebooks import notebook_function

from course_lib.checks.lecture10 import check_balance, check_one_f_one_b
from course_lib.parallel.pipeline_parallel.interleaved import Interleaved1F1B
from course_lib.parallel.pipeline_parallel.pipeline import balance_stages, even_stages
from course_lib.parallel.pipeline_parallel.schedule import one_f_one_b_schedule, schedule

NOTEBOOK = "10_pipeline_parallel.ipynb"


@pytest.mark.parametrize(
    "check, answer, name",
    [(check_one_f_one_b, my_1f1b, "my_1f1b"), (check_balance, my_balance, "my_balance")],
)
def test_answer_passes_and_notebook_stub_fails(check, answer, name):
    assert check(answer, verbose=False), check(answer, verbose=False).detail
    stub = check(notebook_function(NOTEBOOK, name), verbose=False)
    assert not stub and "not implemented yet" in stub.detail


def test_the_library_is_refused():
    # Interleaved1F1B(1) is plain 1F1B: it must not slip past the refusal either
    delegates = (
        one_f_one_b_schedule,
        lambda p, m, s: schedule("1f1b", p, m, s),
        Interleaved1F1B(1),
    )
    for delegate in delegates:
        verdict = check_one_f_one_b(delegate, verbose=False)
        assert not verdict and "schedule.one_f_one_b_schedule, which answers" in verdict.detail
    verdict = check_balance(lambda costs, p: balance_stages(costs, p), verbose=False)
    assert not verdict and "pipeline.balance_stages, which answers" in verdict.detail
    assert check_balance(my_balance, verbose=False)  # restored for the check's own reference


def test_plausible_mistakes_fail():
    def gpipe(p, m, s):  # all forwards, then all backwards: right bubble, too many activations
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]

    def even(costs, p):  # equal layer counts, not equal costs
        return even_stages(len(costs), p)

    assert "stores at most" in check_one_f_one_b(gpipe, verbose=False).detail
    assert "the best split's" in check_balance(even, verbose=False).detail
