"""Lecture 6's exercise checks pass the instructor's answers and fail the notebook's stubs, the
library's one-line answers and the tempting mistakes."""

from __future__ import annotations

from lecture06_answers import my_gossip_matrix, my_spectral_gap
from lecture_notebooks import notebook_function

from course_lib.checks.lecture06 import (
    check_gossip_matrix,
    check_spectral_gap,
    eigenvalue_gap,
    wrong_gossip_matrix,
)
from course_lib.collectives import mixing
from course_lib.collectives.mixing import gossip_matrix, spectral_gap

NOTEBOOK = "06_topologies.ipynb"


def test_gossip_matrix_check():
    assert check_gossip_matrix(my_gossip_matrix, verbose=False)
    stub = check_gossip_matrix(notebook_function(NOTEBOOK, "my_gossip_matrix"), verbose=False)
    assert not stub and "not implemented" in str(stub)
    wrong = check_gossip_matrix(wrong_gossip_matrix, verbose=False)
    assert not wrong and "counts twice" in str(wrong)
    library = check_gossip_matrix(lambda p, s: gossip_matrix(p, s), verbose=False)
    assert not library and "calls course_lib.collectives.mixing.gossip_matrix" in str(library)


def test_spectral_gap_check():
    assert check_spectral_gap(my_spectral_gap, verbose=False)
    stub = check_spectral_gap(notebook_function(NOTEBOOK, "my_spectral_gap"), verbose=False)
    assert not stub and "not implemented" in str(stub)
    wrong = check_spectral_gap(eigenvalue_gap, verbose=False)
    assert not wrong and "non-symmetric" in str(wrong)
    for delegate, callee in ((lambda w: spectral_gap(w), "spectral_gap"),
                             (lambda w: 1 - mixing.contraction(w), "contraction")):  # fmt: skip
        verdict = check_spectral_gap(delegate, verbose=False)
        assert not verdict and f"calls course_lib.collectives.mixing.{callee}" in str(verdict)
    assert spectral_gap(mixing.allreduce_matrix(3)) == 1.0  # restored after the check
