"""Checks for the exercises of lecture 5 (synchronisation schemes); no engines needed.

Exercise 5.1: the staleness of every gradient a fully asynchronous server applies, for a given
order of arrivals. Exercise 5.2: the stale-synchronous gate (Ho et al. 2013). Both are replayed
against :class:`~course_lib.parallel.asynchronous.staleness.StalenessLedger`, the bookkeeping the kit's
server runs on the engines, on fixed and random orders. While the student's function runs, the
ledger's own methods refuse to (:func:`course_lib.checks.verdict.refusing`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from course_lib.checks.verdict import Verdict, refusing, run_check
from course_lib.i18n import N_, _
from course_lib.parallel.asynchronous.staleness import StalenessLedger

__all__ = [
    "REFUSED",
    "check_ssp_gate",
    "check_staleness",
]

_LEDGER = "course_lib.parallel.asynchronous.staleness.StalenessLedger"
REFUSED = {  # exercise -> the library functions that answer it, and what to write instead
    "5.1": {
        f"{_LEDGER}.arrive": N_("keep the version and each worker's last read version yourself"),
        f"{_LEDGER}.release": N_("keep the version and each worker's last read version yourself"),
    },
    "5.2": {
        f"{_LEDGER}.may_proceed": N_("compare the worker's clock with the slowest live clock"),
        f"{_LEDGER}.slowest": N_("take the minimum clock over the live workers yourself"),
    },
}


# ---- Exercise 5.1: staleness of a scripted order ------------------------------------------------
def _orders(seed: int, count: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    cases = [([1, 2, 1, 2], 2), ([1, 1, 1, 2], 2), ([3, 1, 2, 1, 1, 3], 3)]
    for _case in range(count):
        workers = rng.randint(1, 5)
        weights = [rng.random() + 0.05 for _worker in range(workers)]  # some workers much slower
        cases.append((rng.choices(range(1, workers + 1), weights, k=rng.randint(1, 30)), workers))
    return cases


def _staleness_body(fn: Callable) -> str:
    cases = _orders(51, 40)
    for order, workers in cases:
        ledger = StalenessLedger(list(range(1, workers + 1)), bound=None)
        ledger.start()
        for w in order:
            ledger.arrive(w, ledger.computing[w][0])
            ledger.release()
        want = [a.staleness for a in ledger.applied]
        with refusing(REFUSED["5.1"], fn):
            got = fn(list(order), workers)
        got = [int(v) for v in got] if got is not None else None
        assert got == want, _(
            "for arrivals {order} from {workers} workers you gave {got}, the server records "
            "{want} (staleness = updates applied since that worker last read the weights)"
        ).format(order=order, workers=workers, got=got, want=want)
    return _("{n} orders of arrivals, every staleness as the server records it").format(
        n=len(cases)
    )


def check_staleness(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 5.1: ``fn(order, workers) -> [staleness, ...]`` against the server's ledger."""
    return run_check(
        "5.1", "staleness of each gradient", lambda: _staleness_body(fn), verbose=verbose
    )


# ---- Exercise 5.2: the SSP gate -----------------------------------------------------------------
class _StudentGate(StalenessLedger):
    def __init__(self, workers: list[int], bound: int | None, fn: Callable) -> None:
        super().__init__(workers, bound)
        self.fn = fn

    def may_proceed(self, worker: int) -> bool:
        with refusing(REFUSED["5.2"], self.fn):
            return bool(self.fn(dict(self.clocks), set(self.live), worker, self.bound))


def _gate_body(fn: Callable) -> str:
    scenarios = 0
    for bound in (None, 0, 1, 2):
        for seed in range(12):
            rng = random.Random(1000 * seed + (bound if bound is not None else 9))
            workers = list(range(1, rng.randint(2, 5) + 1))
            mine, ref = _StudentGate(workers, bound, fn), StalenessLedger(workers, bound)
            mine.start(), ref.start()
            for _step in range(40):
                if len(ref.live) > 1 and rng.random() < 0.05:
                    dead = rng.choice(sorted(ref.live))
                    mine.drop(dead), ref.drop(dead)
                    ref_out, my_out = ref.release(), mine.release()
                else:
                    w = rng.choice(sorted(ref.computing))  # both agree so far (asserted below)
                    ref.arrive(w, ref.computing[w][0])
                    mine.arrive(w, mine.computing[w][0])
                    ref_out, my_out = ref.release(), mine.release()
                where = _("bound s={bound}, clocks {clocks}, live workers {live}").format(
                    bound=bound, clocks=ref.clocks, live=sorted(ref.live)
                )
                assert my_out == ref_out, _(
                    "{where}: your gate let {mine} proceed, SSP lets {ssp} "
                    "(a worker may go when its clock - slowest live clock <= s)"
                ).format(where=where, mine=my_out or _("nobody"), ssp=ref_out or _("nobody"))
            scenarios += 1
    return _(
        "{n} random runs with s = None, 0, 1, 2 and dying workers; every decision agrees"
    ).format(n=scenarios)


def check_ssp_gate(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 5.2: ``fn(clocks, live, worker, bound) -> bool`` against the SSP rule."""
    return run_check("5.2", "stale-synchronous gate", lambda: _gate_body(fn), verbose=verbose)
