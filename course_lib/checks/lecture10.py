"""Checks for the exercises of lecture 10 (pipeline parallelism): schedules and stage balancing.

Both run on paper (the schedule simulator), so they are fast and deterministic. While the
student's function runs, the library's schedule and balancer refuse to
(:func:`course_lib.checks.verdict.refusing`): the lecture imports them to teach from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from course_lib.checks.verdict import Verdict, refusing, run_check
from course_lib.i18n import N_, _
from course_lib.parallel.pipeline_parallel.pipeline import balance_stages
from course_lib.parallel.pipeline_parallel.schedule import bubble_formula, simulate

__all__ = ["REFUSED", "check_balance", "check_one_f_one_b", "stub_balance", "stub_one_f_one_b"]

_PP = "course_lib.parallel.pipeline_parallel"
REFUSED = {  # exercise -> the library functions that answer it, and what to write instead
    "10.1": {
        f"{_PP}.schedule.one_f_one_b_schedule": N_(
            "list the warm-up forwards, then alternate "
            "one forward and one backward, then the remaining backwards"
        )
    },
    "10.2": {
        f"{_PP}.pipeline.balance_stages": N_(
            "search the smallest maximum stage cost (binary search"
            " with a greedy cut, or dynamic programming)"
        )
    },
}


def stub_one_f_one_b(num_stages: int, num_microbatches: int, stage: int) -> list:
    """The released stub of Exercise 10.1."""
    raise NotImplementedError("Exercise 10.1: return stage's list of ('F', i) / ('B', i)")


def stub_balance(costs: Sequence[float], num_stages: int) -> list:
    """The released stub of Exercise 10.2."""
    raise NotImplementedError("Exercise 10.2: return one (start, stop) layer range per stage")


def _one_f_one_b_body(fn: Callable) -> str:
    cases = [(2, 1), (2, 4), (3, 3), (4, 8), (5, 12)]
    for p, m in cases:
        for s in range(p):
            with refusing(REFUSED["10.1"], fn):
                actions = [tuple(a) for a in fn(p, m, s)]
            want = sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            if sorted(actions) != want:
                raise AssertionError(
                    _(
                        "p={p}, m={m}, stage {s}: every micro-batch needs one ('F', i) and one "
                        "('B', i); got {actions}"
                    ).format(p=p, m=m, s=s, actions=actions)
                )
            if any(actions.index(("B", i)) < actions.index(("F", i)) for i in range(m)):
                raise AssertionError(
                    _("p={p}, m={m}, stage {s}: a backward comes before its forward").format(
                        p=p, m=m, s=s
                    )
                )
        try:
            with refusing(REFUSED["10.1"], fn):
                timeline = simulate(
                    lambda p_, m_, s_: [tuple(a) for a in fn(p_, m_, s_)], [1] * p, m
                )
        except RuntimeError as exc:
            raise AssertionError(f"p={p}, m={m}: {exc}") from None
        if abs(timeline.bubble_fraction - bubble_formula(p, m)) > 1e-12:
            raise AssertionError(
                _(
                    "p={p}, m={m}: bubble {got}, expected (p-1)/(m+p-1) = {want}: a stage waits "
                    "longer than needed"
                ).format(
                    p=p,
                    m=m,
                    got=f"{timeline.bubble_fraction:.3f}",
                    want=f"{bubble_formula(p, m):.3f}",
                )
            )
        limits = [min(p - s, m) for s in range(p)]
        if any(peak > lim for peak, lim in zip(timeline.peak_activations, limits, strict=True)):
            raise AssertionError(
                _(
                    "p={p}, m={m}: stages store {peaks} micro-batches at once; 1F1B stores at "
                    "most p - stage = {limits} (run a backward as soon as possible)"
                ).format(p=p, m=m, peaks=timeline.peak_activations, limits=limits)
            )
    return _("{n} (p, m) pairs: bubble = (p-1)/(m+p-1), stage s stores <= p - s").format(
        n=len(cases)
    )


def check_one_f_one_b(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 10.1: ``fn(p, m, stage)`` is a 1F1B schedule (formula bubble, p - s activations)."""
    return run_check("10.1", "1F1B schedule", lambda: _one_f_one_b_body(fn), verbose=verbose)


def _balance_body(fn: Callable) -> str:
    cases = [
        ([1, 1, 1, 1, 4], 2),
        ([4, 1, 1, 1, 1, 4], 3),
        ([2, 3, 1, 5, 2, 2, 1, 4], 4),
        ([1] * 6, 6),
        ([5, 1, 1, 1], 1),
    ]
    for costs, p in cases:
        with refusing(REFUSED["10.2"], fn):
            got = [tuple(b) for b in fn(costs, p)]
        stop = 0
        for a, b in got:
            if a != stop or b <= a:
                raise AssertionError(
                    _(
                        "costs {costs}, {p} stages: {got} is not a cover of layers 0..{n} by "
                        "non-empty ranges in order"
                    ).format(costs=costs, p=p, got=got, n=len(costs))
                )
            stop = b
        if len(got) != p or stop != len(costs):
            raise AssertionError(
                _("costs {costs}, {p} stages: need {p} ranges covering all, got {got}").format(
                    costs=costs, p=p, got=got
                )
            )
        worst = max(sum(costs[a:b]) for a, b in got)
        best = max(sum(costs[a:b]) for a, b in balance_stages(costs, p))
        if worst > best:
            raise AssertionError(
                _(
                    "costs {costs}, {p} stages: your slowest stage costs {worst}, the best "
                    "split's {best}"
                ).format(costs=costs, p=p, worst=worst, best=best)
            )
    return _("{n} cost lists: slowest stage as cheap as possible").format(n=len(cases))


def check_balance(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 10.2: ``fn(costs, p)`` returns contiguous stages whose slowest is the cheapest."""
    return run_check("10.2", "balance stages", lambda: _balance_body(fn), verbose=verbose)
