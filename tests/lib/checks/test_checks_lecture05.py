"""Lecture 5's checks: the instructor's answers pass; the notebook's stubs, answers that replay
the library's ledger, and plausible wrong answers fail with a reason."""

from __future__ import annotations

import pytest
from lecture05_answers import my_may_proceed, my_staleness
from lecture_notebooks import notebook_function

from course_lib.checks.lecture05 import check_ssp_gate, check_staleness
from course_lib.parallel.asynchronous.staleness import StalenessLedger

NOTEBOOK = "05_synchronisation.ipynb"


def test_answers_pass():
    assert check_staleness(my_staleness, verbose=False)
    assert check_ssp_gate(my_may_proceed, verbose=False)


@pytest.mark.parametrize(
    "check, name", [(check_staleness, "my_staleness"), (check_ssp_gate, "my_may_proceed")]
)
def test_notebook_stubs_fail_as_not_implemented(check, name):
    verdict = check(notebook_function(NOTEBOOK, name), verbose=False)
    assert not verdict and "not implemented yet" in str(verdict)


def test_answers_through_the_ledger_are_refused():
    def replayed(order, workers):  # the server's own bookkeeping, replayed
        ledger = StalenessLedger(list(range(1, workers + 1)), bound=None)
        ledger.start()
        for w in order:
            ledger.arrive(w, ledger.computing[w][0])
            ledger.release()
        return [a.staleness for a in ledger.applied]

    def ledger_gate(clocks, live, worker, bound):  # the review's one call
        ledger = StalenessLedger(sorted(clocks), bound)
        ledger.clocks, ledger.live = dict(clocks), set(live)
        return ledger.may_proceed(worker)

    verdict = check_staleness(replayed, verbose=False)
    assert not verdict and "StalenessLedger.arrive, which answers" in verdict.detail, verdict
    verdict = check_ssp_gate(ledger_gate, verbose=False)
    assert not verdict and "StalenessLedger.may_proceed, which answers" in verdict.detail
    assert check_ssp_gate(my_may_proceed, verbose=False)  # the ledger is restored


def test_wrong_staleness_fails():
    def counts_own_updates_too(order, workers):  # staleness counted from the start, not the read
        return list(range(len(order)))

    def one_short(order, workers):
        return [max(0, s - 1) for s in my_staleness(order, workers)]

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
