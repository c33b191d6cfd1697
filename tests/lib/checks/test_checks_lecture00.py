"""Lecture 0's check on real engines: the instructor's answer passes; the notebook's stub and
answers that sum in the notebook (after a scatter, or of the gathered parts) fail."""

from __future__ import annotations

import pytest
from lecture00_answers import sum_of_squares_on_engines
from lecture_notebooks import notebook_function

from course_lib.checks.lecture00 import check_sum_of_squares, numbers_in

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def view(shared_engines):
    return shared_engines(3).view  # from the session's pool (tests/conftest.py)


def scatter_then_sum_here(view, N):
    """The review's answer: the engines receive the numbers, the notebook does the sum."""
    view.scatter("part", range(N), block=True)
    return sum(i * i for i in range(N))


def gather_then_sum_here(view, N):
    """The parts make a round trip; the squares are summed in the notebook."""
    view.scatter("part", range(N), block=True)
    return sum(i * i for part in view.pull("part", block=True) for i in part)


def squares_mapped(view, N):
    """The engines square, the notebook adds N numbers: not one partial sum per engine."""
    return sum(view.map_sync(lambda i: i * i, range(N)))


def test_answer_passes(view):
    verdict = check_sum_of_squares(sum_of_squares_on_engines, view, verbose=False)
    assert verdict, verdict.detail
    assert "3 engines" in verdict.detail


def test_stub_fails(view):
    stub = notebook_function("00_cluster.ipynb", "sum_of_squares_on_engines")
    verdict = check_sum_of_squares(stub, view, verbose=False)
    assert not verdict and "not implemented yet" in verdict.detail


def test_a_sum_in_the_notebook_fails(view):
    verdict = check_sum_of_squares(scatter_then_sum_here, view, verbose=False)
    assert not verdict and "the sum was computed in the notebook" in verdict.detail, verdict
    for wrong in (gather_then_sum_here, squares_mapped):
        verdict = check_sum_of_squares(wrong, view, verbose=False)
        assert not verdict and "came back from the engines" in verdict.detail, verdict


def test_a_wrong_sum_fails(view):
    verdict = check_sum_of_squares(lambda v, N: N * N, view, verbose=False)
    assert not verdict and "expected" in verdict.detail


def test_numbers_in_flattens_what_engines_return():
    import numpy as np

    assert numbers_in([1, (2, 3.5), range(2), {"a": np.arange(2)}, None, "x", True]) == [
        1, 2, 3.5, 0, 1, 0, 1,
    ]  # fmt: skip
