"""Lecture 13's search: Metropolis-Hastings finds what exhaustive search finds on a small space.

Reference: every strategy of a small space simulated (exhaustive search). The graph is the kit's
MLP on 2 workers over a slow link with a small batch, where the best strategy is neither pure
data parallelism nor the expert hybrid (it is one worker alone: the link costs more than the
second worker saves), so the chain has to walk from either start.
"""

from __future__ import annotations

import pytest

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.configs import data_parallel, expert_hybrid
from course_lib.cost_model.op_costs import FlopsCosts
from course_lib.cost_model.search import exhaustive, mcmc, search_space
from course_lib.cost_model.simulator import Simulator
from course_lib.training.operator_graphs import kit_graph


@pytest.fixture(scope="module")
def small():
    graph = kit_graph("mlp", 16)
    sim = Simulator(graph, 2, FlopsCosts(1e9), LinkModel(alpha=1e-4, beta=1e-7))
    space = search_space(sim, degrees=[1, 2])
    best, best_time, size = exhaustive(sim, space)
    return sim, space, best, best_time, size


def test_the_small_space_is_searched_whole_and_its_optimum_is_not_a_textbook_strategy(small):
    sim, space, best, best_time, size = small
    assert 100 < size < 20_000
    graph = sim.graph
    for start in (data_parallel(graph, 2), expert_hybrid(graph, 2)):
        assert sim.run(start).step_time > best_time


@pytest.mark.parametrize("start", [data_parallel, expert_hybrid])
def test_mcmc_finds_the_exhaustive_optimum(small, start):
    sim, space, best, best_time, _ = small
    found = mcmc(sim, start(sim.graph, 2), iterations=3000, seed=0, space=space)
    assert found.best_time == pytest.approx(best_time, rel=1e-12)
    assert sim.run(found.best).step_time == pytest.approx(found.best_time, rel=1e-12)


def test_mcmc_is_seeded_and_never_reports_worse_than_its_start(small):
    sim, space, *_ = small
    start = data_parallel(sim.graph, 2)
    a = mcmc(sim, start, iterations=200, seed=3, space=space)
    b = mcmc(sim, start, iterations=200, seed=3, space=space)
    assert a.trace == b.trace and a.best == b.best
    assert a.best_time <= a.start_time and 0 < a.accepted <= a.iterations == 200


def test_a_search_without_a_budget_names_the_fix(small):
    sim, *_ = small
    with pytest.raises(ValueError, match="iterations=... or seconds="):
        mcmc(sim, data_parallel(sim.graph, 2))


def test_an_accept_step_passed_in_drives_the_walk(small):
    import math

    sim, space, *_ = small
    start = data_parallel(sim.graph, 2)

    def metropolis(t_cur, t_new, beta, rng):
        return t_new <= t_cur or rng.random() < math.exp(-beta * (t_new - t_cur))

    built_in = mcmc(sim, start, iterations=300, seed=5, space=space)
    passed_in = mcmc(sim, start, iterations=300, seed=5, space=space, accept=metropolis)
    assert passed_in.trace == built_in.trace  # the same rule, the same draws
    greedy = mcmc(sim, start, iterations=300, seed=5, space=space, accept=lambda a, b, *_: b <= a)
    assert greedy.trace == sorted(greedy.trace, reverse=True)  # never climbs
