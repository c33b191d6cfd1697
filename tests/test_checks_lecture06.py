"""Lecture 6's exercise checks pass the reference, fail the stubs and the tempting mistakes."""

from __future__ import annotations

from course_lib.checks.lecture06 import (
    check_gossip_matrix,
    check_spectral_gap,
    eigenvalue_gap,
    reference_gossip_matrix,
    reference_spectral_gap,
    stub_gossip_matrix,
    stub_spectral_gap,
    wrong_gossip_matrix,
)


def test_gossip_matrix_check():
    assert check_gossip_matrix(reference_gossip_matrix, verbose=False)
    stub = check_gossip_matrix(stub_gossip_matrix, verbose=False)
    assert not stub and "not implemented" in str(stub)
    wrong = check_gossip_matrix(wrong_gossip_matrix, verbose=False)
    assert not wrong and "counts twice" in str(wrong)


def test_spectral_gap_check():
    assert check_spectral_gap(reference_spectral_gap, verbose=False)
    assert not check_spectral_gap(stub_spectral_gap, verbose=False)
    wrong = check_spectral_gap(eigenvalue_gap, verbose=False)
    assert not wrong and "non-symmetric" in str(wrong)
