"""Lecture 8's exercise checks pass the instructor's answers and fail the notebook's stubs, the
library's one-call answers and the tempting mistakes."""

from __future__ import annotations

from lecture08_answers import my_regime_rate, my_values_sent
from lecture_notebooks import notebook_function

from course_lib.checks.lecture08 import (
    check_regime_rate,
    check_values_sent,
    one_hop_regime_rate,
    two_messages_values_sent,
)
from course_lib.papers.source000_table import source_regime_rate
from course_lib.papers.source001_configurations import predict_values_sent

NOTEBOOK = "08_reproducing_the_papers.ipynb"


def test_values_sent_check():
    assert check_values_sent(my_values_sent, verbose=False)
    stub = check_values_sent(notebook_function(NOTEBOOK, "my_values_sent"), verbose=False)
    assert not stub and "not implemented" in str(stub)
    wrong = check_values_sent(two_messages_values_sent, verbose=False)
    assert not wrong and "same rank" in str(wrong)
    library = check_values_sent(
        lambda *args: predict_values_sent(*args), verbose=False
    )  # the review's one call
    assert not library and "calls course_lib.papers.source001_configurations" in str(library)


def test_regime_rate_check():
    assert check_regime_rate(my_regime_rate, exercise="8.2", verbose=False)
    stub = notebook_function(NOTEBOOK, "my_regime_rate")
    stub = check_regime_rate(stub, exercise="8.2", verbose=False)
    assert not stub and "not implemented" in str(stub) and str(stub).startswith("Exercise 8.2")
    wrong = check_regime_rate(one_hop_regime_rate, exercise="8.2", verbose=False)
    assert not wrong and "uploads" in str(wrong)
    library = check_regime_rate(source_regime_rate, exercise="8.2", verbose=False)
    assert not library and "source000_table.source_regime_rate, which answers" in str(library)
