"""Lecture 5's checks: the reference answers pass; the stubs and plausible wrong answers fail."""

from __future__ import annotations

from course_lib.checks.lecture05 import (
    check_ssp_gate,
    check_staleness,
    reference_may_proceed,
    reference_staleness,
    stub_may_proceed,
    stub_staleness,
)


def test_reference_answers_pass():
    assert check_staleness(reference_staleness, verbose=False)
    assert check_ssp_gate(reference_may_proceed, verbose=False)


def test_stubs_fail_as_not_implemented():
    for verdict in (
        check_staleness(stub_staleness, verbose=False),
        check_ssp_gate(stub_may_proceed, verbose=False),
    ):
        assert not verdict and "not implemented yet" in str(verdict)


def test_wrong_staleness_fails():
    def counts_own_updates_too(order, workers):  # staleness counted from the start, not the read
        return list(range(len(order)))

    def one_short(order, workers):
        return [max(0, s - 1) for s in reference_staleness(order, workers)]

    for wrong in (counts_own_updates_too, one_short):
        verdict = check_staleness(wrong, verbose=False)
        assert not verdict and "the server records" in str(verdict), str(verdict)


def test_wrong_gates_fail():
    def strict(clocks, live, worker, bound):  # '<' instead of '<=': s = 0 deadlocks
        return bound is None or clocks[worker] - min(clocks[w] for w in live) < bound

    def counts_the_dead(clocks, live, worker, bound):  # a dead worker holds everyone back
        return bound is None or clocks[worker] - min(clocks.values()) <= bound

    def never_waits(clocks, live, worker, bound):
        return True

    for wrong in (strict, counts_the_dead, never_waits):
        verdict = check_ssp_gate(wrong, verbose=False)
        assert not verdict and "SSP lets" in str(verdict), (wrong.__name__, str(verdict))
