"""Checks of assignment A8 (choosing a strategy: an attribute split's halo, a Metropolis-Hastings search).

No engines in the judging: the exercises are judged against the kit's execution simulator
(:mod:`course_lib.cost_model`), in the notebook's process and, for ``./kit grade``, in the
grader's (:mod:`course_grader.assignments.a8.probe`): the kernel only calls the answer on the cases
below (``a8_cases(exercise, seed)``, the grader picks the seed) and returns what it gave, as data.

- A8.1: the messages of a convolution split by image height (source 003's attribute split) whose
  input is split the same way: the halo rows each worker receives from its neighbours in the
  forward pass, and their gradients sent back in the backward pass, as ``(src, dst, bytes)``.
  The reference is the task graph the simulator builds for that strategy
  (:class:`~course_lib.cost_model.task_graph.TaskGraphBuilder`: one message per directed pair
  and pass), on shapes, kernels, paddings, strides and degrees drawn from the seed.
- A8.2: a Metropolis-Hastings search over strategies with the simulator as a black-box cost. On a
  small space (the MLP on 2 workers, every strategy's predicted step time tabulated from the
  simulator) the search must find the exhaustive optimum and return the best strategy it saw;
  on a three-level space its walk must spend its time as the Boltzmann weights exp(-beta t)
  say, which only the exp(-beta delta) acceptance gives (a statistical test: it does not
  depend on how the answer draws its random numbers).

- A8.3: choosing a strategy for a room (a link rate, 2 PCs, a memory per PC with Adam's state
  counted, a budget of simulations): the pick must fit the memory and be within
  :data:`~course_grader.assignments.a8.judge.ROOM_MARGIN` of the fastest strategy that fits,
  the room's step times being the simulator's (every strategy tabulated by the grader).

Typical mistakes fail with a reason naming them: a halo for an edge worker's missing neighbour,
float64 bytes, no backward messages, exp(+beta delta), a best that is only the last state.
The cases are :mod:`course_grader.assignments.a8.cases`, the judges
:mod:`course_grader.assignments.a8.judge`; this module holds the check cells.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from course_grader.assignments.a8.cases import a8_cases
from course_grader.assignments.a8.judge import ROOM_MARGIN, judge_halo, judge_room, judge_search
from course_lib.checks.verdict import Verdict, run_check
from course_lib.i18n import N_, _

__all__ = [
    "A8_DETAILS",
    "A8_POINTS",
    "a8_body",
    "a8_cases",
    "a8_detail",
    "check_choice",
    "check_halo_messages",
    "check_mh_search",
    "run_room",
    "run_search",
]

A8_POINTS = {"A8.1": 3.0, "A8.2": 3.0, "A8.3": 4.0}
#: what each exercise's PASS line says (templates: :func:`a8_detail` fills in the margin)
A8_DETAILS = {
    "A8.1": N_("forward halos and backward gradients equal to the simulator's task graph"),
    "A8.2": N_(
        "the walk's time at each level as exp(-beta t), the best seen kept on a hot walk, "
        "the exhaustive optimum found"
    ),
    "A8.3": N_(
        "the pick fits each room's memory (Adam's state counted) and is within "
        "{margin} of the fastest strategy that fits, within the budget of simulations"
    ),
}


def a8_detail(exercise: str) -> str:
    """``exercise``'s PASS detail in the current language."""
    return _(A8_DETAILS[exercise]).format(margin=f"{ROOM_MARGIN:.0%}")


def run_search(mh_search: Callable, case: dict):
    """Call the answer on one case: the cost is a look-up in the case's table of step times."""
    table = np.asarray(case["table"], dtype=float)

    def cost(strategy) -> float:
        return float(table[tuple(int(v) for v in strategy)])

    return mh_search(
        cost,
        tuple(table.shape),
        tuple(case["start"]),
        case["beta"],
        case["iterations"],
        np.random.default_rng(case["rng_seed"]),
    )


def run_room(choose_strategy: Callable, case: dict):
    """Call the answer in one room: ``simulate`` looks the strategy up, at most ``budget`` distinct."""
    times = np.asarray(case["times"], dtype=float)
    peaks = np.asarray(case["peaks"], dtype=float)
    asked: set = set()

    def simulate(strategy) -> tuple[float, float]:
        s = tuple(int(v) for v in strategy)
        if s not in asked:
            if len(asked) >= case["budget"]:
                raise RuntimeError(
                    _("budget spent: more than {budget} distinct strategies simulated").format(
                        budget=case["budget"]
                    )
                )
            asked.add(s)
        return float(times[s]), float(peaks[s])

    return choose_strategy(
        simulate, tuple(times.shape), case["memory"], case["budget"],
        np.random.default_rng(case["rng_seed"]),
    )  # fmt: skip


def a8_body(exercise: str, run_case: Callable, seed: int | None = None) -> str:
    """Run ``exercise``'s cases through ``run_case(case)`` and judge them; return the detail."""
    cases = a8_cases(exercise, seed)
    for case in cases:
        if exercise == "A8.1":
            judge_halo(lambda case=case: run_case(case), case)
        elif exercise == "A8.3":
            judge_room(run_case, case)
        else:
            judge_search(run_case, case)
    detail = a8_detail(exercise)
    if exercise == "A8.1":
        return _("{n} convolutions on 2-4 workers, {detail}").format(n=len(cases), detail=detail)
    if exercise == "A8.3":
        return _("{n} rooms: {detail}").format(n=len(cases), detail=detail)
    return _("3 levels and a space of {size} strategies: {detail}").format(
        size=cases[2]["table"].size, detail=detail
    )


def check_halo_messages(
    halo_messages: Callable, *, verbose: bool = True, seed: int | None = None
) -> Verdict:
    """A8.1: ``halo_messages(batch, channels, height, width, kernel, padding, stride, workers)``."""
    return run_check(
        "A8.1",
        "halo_messages",
        lambda: a8_body("A8.1", lambda case: halo_messages(**case), seed),
        max_points=A8_POINTS["A8.1"],
        verbose=verbose,
    )


def check_mh_search(
    mh_search: Callable, *, verbose: bool = True, seed: int | None = None
) -> Verdict:
    """A8.2: ``mh_search(cost, choices, start, beta, iterations, rng) -> (best, best_time, walk)``."""
    return run_check(
        "A8.2",
        "mh_search",
        lambda: a8_body("A8.2", lambda case: run_search(mh_search, case), seed),
        max_points=A8_POINTS["A8.2"],
        verbose=verbose,
    )


def check_choice(
    choose_strategy: Callable, *, verbose: bool = True, seed: int | None = None
) -> Verdict:
    """A8.3: ``choose_strategy(simulate, choices, memory, budget, rng) -> strategy``."""
    return run_check(
        "A8.3",
        "choose_strategy",
        lambda: a8_body("A8.3", lambda case: run_room(choose_strategy, case), seed),
        max_points=A8_POINTS["A8.3"],
        verbose=verbose,
    )
