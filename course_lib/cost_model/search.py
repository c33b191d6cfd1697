"""Lecture 13: Searching the strategy space: Metropolis-Hastings, and exhaustive where it is small.

FlexFlow (source 003) walks the space of strategies with a Markov chain: propose a neighbour
(one random operator gets one random configuration), simulate it (delta simulation), and accept
it with probability $\\min(1, e^{-\\beta (t_{new} - t_{cur})})$, so a worse strategy is sometimes
kept and the walk can leave a local optimum. Seeded, it starts from data parallelism or from
the expert hybrid and stops after a budget of iterations or seconds, returning the best strategy
it saw. :func:`exhaustive` simulates every strategy of a small space, the witness that the
chain finds the optimum.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from course_lib.cost_model.configs import ParallelConfig, candidates
from course_lib.cost_model.simulator import Simulator

__all__ = ["SearchResult", "exhaustive", "mcmc", "search_space"]


@dataclass
class SearchResult:
    """The best strategy found, its predicted step time, and how the search got there."""

    best: tuple[ParallelConfig, ...]
    best_time: float
    start_time: float
    iterations: int = 0
    accepted: int = 0
    seconds: float = 0.0
    seconds_to_best: float = 0.0
    trace: list[float] = field(default_factory=list)  # current step time after each iteration


def search_space(sim: Simulator, degrees=None) -> list[list[ParallelConfig]]:
    """Return the candidate configurations of every operator (see :func:`candidates`)."""
    g = sim.graph
    return [candidates(op, g.batch, sim.world_size, degrees) for op in g.ops]


def mcmc(
    sim: Simulator,
    start: tuple[ParallelConfig, ...],
    *,
    iterations: int | None = None,
    seconds: float | None = None,
    beta: float | None = None,
    seed: int = 0,
    space: list[list[ParallelConfig]] | None = None,
    accept: Callable[[float, float, float, random.Random], bool] | None = None,
) -> SearchResult:
    """Return the best strategy a Metropolis-Hastings walk from ``start`` finds within its budget.

    ``beta`` is in 1/seconds; by default ``5 / t(start)``, so a proposal 20 % slower than the
    start is accepted with probability $e^{-1}$: hot enough to climb out of the expert hybrid's
    basin on the tests' small space (with ``20 / t`` most seeds stay stuck there), and the best
    strategy seen is kept whatever the chain does next. Give ``iterations`` or ``seconds``.
    ``accept(t_cur, t_new, beta, rng)`` replaces the acceptance step (lecture 13's exercise
    plugs its own in); it must draw only from ``rng``, so a seeded walk stays reproducible.
    """
    if iterations is None and seconds is None:
        raise ValueError("give a budget: iterations=... or seconds=...")
    rng = random.Random(seed)
    space = space or search_space(sim)
    cur = tuple(start)
    t0 = time.perf_counter()
    cur_sim = sim.run(cur)
    cur_time = cur_sim.step_time
    beta = beta if beta is not None else 5.0 / max(cur_time, 1e-12)
    out = SearchResult(cur, cur_time, cur_time)
    while (iterations is None or out.iterations < iterations) and (
        seconds is None or time.perf_counter() - t0 < seconds
    ):
        out.iterations += 1
        i = rng.randrange(len(cur))
        proposal = cur[:i] + (rng.choice(space[i]),) + cur[i + 1 :]
        new_sim = sim.delta(cur_sim, proposal)
        dt = new_sim.step_time - cur_time
        if (
            accept(cur_time, new_sim.step_time, beta, rng)
            if accept is not None
            else dt <= 0 or rng.random() < math.exp(-beta * dt)
        ):
            cur, cur_sim, cur_time = proposal, new_sim, new_sim.step_time
            out.accepted += 1
            if cur_time < out.best_time:
                out.best, out.best_time = cur, cur_time
                out.seconds_to_best = time.perf_counter() - t0
        out.trace.append(cur_time)
    out.seconds = time.perf_counter() - t0
    return out


def exhaustive(
    sim: Simulator, space: list[list[ParallelConfig]] | None = None, limit: int = 100_000
):
    """Return (best strategy, its step time, strategies simulated) over the whole ``space``."""
    space = space or search_space(sim)
    size = math.prod(len(c) for c in space)
    if size > limit:
        raise ValueError(
            f"the space has {size} strategies, more than limit={limit}: restrict the "
            "degrees (search_space(sim, degrees=[...])) or use mcmc"
        )
    best, best_time, prev = None, math.inf, None
    for strategy in itertools.product(*space):
        prev = sim.run(strategy) if prev is None else sim.delta(prev, strategy)
        if prev.step_time < best_time:
            best, best_time = strategy, prev.step_time
    return best, best_time, size
