"""A8's cases, drawn from a seed and priced by the kit's simulator: convolutions, strategy tables.

A8.1's cases are convolutions split by image height (shapes, kernels, paddings, strides and
degrees drawn from the seed) and their reference messages, read off the task graph that
:class:`~course_lib.cost_model.task_graph.TaskGraphBuilder` builds for that strategy
(:func:`simulated_halo`). A8.2's are tables of predicted step times: every strategy of the MLP
on 2 workers (:func:`strategy_table`), three levels of one operator, and a hot walk's random
table. A8.3's are rooms (a link rate, 2 PCs, a memory per PC, a budget of simulations) in which
every strategy of the MLP has a predicted step time and peak memory with Adam's state
(:func:`room_tables`). The judges are :mod:`course_grader.assignments.a8.judge`.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

__all__ = [
    "ROOM_BUDGET",
    "STATS_ITERATIONS",
    "STATS_LEVELS",
    "a8_cases",
    "room_tables",
    "simulated_halo",
    "strategy_table",
]

STATS_LEVELS = 3
ROOM_BUDGET = 800  # distinct strategies a choice may simulate: under a third of the MLP's 2880
STATS_ITERATIONS = 20_000


# (kernel, padding, stride, workers) of A8.1's cases: symmetric halos on 2 and 3 workers, valid
# convolutions (a halo below only), a wide kernel on 4 workers, a stride, a 1x1 kernel (no halo
# at all). Every kind lets the input and output heights both split over the workers.
_HALO_KINDS = [
    (3, 1, 1, 2),
    (3, 1, 1, 3),
    (3, 0, 1, 2),
    (5, 2, 1, 4),
    (5, 0, 1, 4),
    (3, 1, 2, 2),
    (1, 0, 1, 4),
]


def _halo_case(rng: np.random.Generator, kernel, padding, stride, workers) -> dict:
    """A case whose input and output heights split over ``workers``, halos from neighbours only."""
    for _ in range(1000):
        rows = int(rng.integers(max(kernel, 2), 8))  # input rows per worker
        height = rows * workers
        out_h = (height + 2 * padding - kernel) // stride + 1
        if out_h % workers:
            continue
        case = {
            "batch": int(rng.integers(1, 9)),
            "channels": int(rng.integers(1, 7)),
            "height": height,
            "width": int(rng.integers(max(kernel, 3), 13)),
            "kernel": kernel,
            "padding": padding,
            "stride": stride,
            "workers": workers,
        }
        forward, _ = simulated_halo(**case)
        if all(abs(s - d) == 1 for s, d in forward):
            return case
    raise ValueError(f"no heights split {kernel}, {padding}, {stride} over {workers} workers")


def simulated_halo(
    batch, channels, height, width, kernel, padding, stride, workers
) -> tuple[dict, dict]:
    """The simulator's messages of the convolution's input edge: ({(src, dst): bytes}) x 2.

    The graph is relu -> conv2d -> flatten -> loss on (channels, height, width) images; the relu
    and the convolution are both split by height over every worker, so the only messages into
    the convolution are its halo (forward) and the halo's gradient (backward).
    """
    from course_lib.cost_model.alpha_beta import LinkModel
    from course_lib.cost_model.configs import ParallelConfig
    from course_lib.cost_model.operators import build_graph
    from course_lib.cost_model.task_graph import TaskGraphBuilder

    layers = [("relu",), ("conv2d", 2, kernel, padding, stride), ("flatten",), ("loss",)]
    graph = build_graph("halo", (channels, height, width), layers, batch)
    split = ParallelConfig("attribute", tuple(range(workers)))
    one = ParallelConfig("replicate", (0,))
    builder = TaskGraphBuilder(graph, workers, lambda *_: (0.0, 0.0), LinkModel(1e-5, 1e-9))
    tasks = builder.build((split, split, one, one))
    out: tuple[dict, dict] = ({}, {})
    for tid, task in tasks.items():
        for k, tag in enumerate(("001xf:", "001xb:")):
            if tid.startswith(tag):
                src, dst = (int(v) for v in tid[len(tag) :].split(">"))
                out[k][(src, dst)] = int(task.nbytes)
    return out


def _halo_cases(seed: int | None) -> list[dict]:
    rng = np.random.default_rng(801 + (seed or 0))
    return [_halo_case(rng, *kind) for kind in _HALO_KINDS]


def _space_case(rng: np.random.Generator) -> dict:
    """A8.2's small space: every strategy of the MLP on 2 workers, its predicted step time."""
    table = strategy_table(int(rng.choice([32, 64, 128])), float(rng.choice([50e6, 117e6, 1e9])))
    start = tuple(int(rng.integers(c)) for c in table.shape)
    t0 = float(table[start])
    return {
        "what": "space",
        "table": table,
        "start": list(start),
        "beta": math.log(2)
        / (0.05 * t0),  # a move 5 % worse than the start: accepted half the time
        "iterations": 20_000,
        "rng_seed": int(rng.integers(2**31)),
    }


def strategy_table(batch: int, bytes_per_s: float) -> np.ndarray:
    """Every strategy's predicted step time (s): the MLP on 2 workers, FLOP costs at 10 GFLOP/s.

    ``table[i0, i1, ...]`` is the strategy giving operator k its ``ik``-th candidate
    configuration (:func:`course_lib.cost_model.search.search_space`'s order).
    """
    from course_lib.cost_model.alpha_beta import LinkModel
    from course_lib.cost_model.op_costs import FlopsCosts
    from course_lib.cost_model.search import search_space
    from course_lib.cost_model.simulator import Simulator
    from course_lib.training.operator_graphs import kit_graph

    sim = Simulator(kit_graph("mlp", batch), 2, FlopsCosts(1e10), LinkModel(50e-6, 1 / bytes_per_s))
    space = search_space(sim)
    table = np.empty([len(c) for c in space])
    prev = None
    for index in itertools.product(*(range(len(c)) for c in space)):
        strategy = tuple(c[i] for c, i in zip(space, index, strict=True))
        prev = sim.run(strategy) if prev is None else sim.delta(prev, strategy)
        table[index] = prev.step_time
    return table


@functools.lru_cache(maxsize=16)  # 3 batches x 3 link rates
def room_tables(batch: int, bytes_per_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Every strategy's predicted step time (s) and peak bytes per PC: the MLP on 2 PCs, Adam.

    Indexed as :func:`strategy_table` (one candidate index per operator); memory is weights,
    gradients, Adam's two moments (``optimizer_bytes=8``) and the activations a PC holds.
    """
    from course_lib.cost_model.alpha_beta import LinkModel
    from course_lib.cost_model.op_costs import FlopsCosts
    from course_lib.cost_model.search import search_space
    from course_lib.cost_model.simulator import Simulator
    from course_lib.training.operator_graphs import kit_graph

    sim = Simulator(
        kit_graph("mlp", batch), 2, FlopsCosts(1e10), LinkModel(50e-6, 1 / bytes_per_s),
        optimizer_bytes=8,
    )  # fmt: skip
    space = search_space(sim)
    times, peaks = np.empty([len(c) for c in space]), np.empty([len(c) for c in space])
    prev = None
    for index in itertools.product(*(range(len(c)) for c in space)):
        strategy = tuple(c[i] for c, i in zip(space, index, strict=True))
        prev = sim.run(strategy) if prev is None else sim.delta(prev, strategy)
        times[index] = prev.step_time
        peaks[index] = max(prev.peak_memory().values())
    return times, peaks


def _room_case(rng: np.random.Generator) -> dict:
    """A room whose memory is too small for the fastest strategy, large enough for some."""
    batch = int(rng.choice([32, 64, 128]))
    rate = float(rng.choice([20e6, 125e6, 1.25e9]))
    times, peaks = room_tables(batch, rate)
    fastest = np.unravel_index(int(times.argmin()), times.shape)
    low = float(peaks.min())
    memory = low + float(rng.uniform(0.3, 0.7)) * (float(peaks[fastest]) - low)
    if peaks[fastest] <= low:  # the fastest is also the smallest: any memory that holds it
        memory = low * 1.1
    return {
        "what": "room",
        "batch": batch,
        "bytes_per_s": rate,
        "workers": 2,
        "memory": float(np.floor(memory)),
        "budget": ROOM_BUDGET,
        "times": times,
        "peaks": peaks,
        "rng_seed": int(rng.integers(2**31)),
    }


def _stats_case(rng: np.random.Generator) -> dict:
    """Three configurations of one operator, t0, t0 + d, t0 + 2d, with beta d = ln 4."""
    t0, d = float(rng.uniform(1e-3, 5e-3)), float(rng.uniform(1e-4, 1e-3))
    return {
        "what": "levels",
        "table": t0 + d * np.arange(STATS_LEVELS, dtype=float),
        "start": [0],
        "beta": math.log(4) / d,
        "iterations": STATS_ITERATIONS,
        "rng_seed": int(rng.integers(2**31)),
    }


def _hot_case(rng: np.random.Generator) -> dict:
    """A hot walk over 216 strategies (beta delta <= 0.1): it visits all, ends anywhere."""
    table = rng.uniform(1e-3, 2e-3, size=(6, 6, 6))
    return {
        "what": "hot",
        "table": table,
        "start": [int(v) for v in rng.integers(6, size=3)],
        "beta": 0.1 / 1e-3,
        "iterations": STATS_ITERATIONS,
        "rng_seed": int(rng.integers(2**31)),
    }


def a8_cases(exercise: str, seed: int | None = None) -> list[dict]:
    """The cases of ``exercise`` (``seed`` None: the notebook's own; the grader picks another)."""
    if exercise == "A8.1":
        return _halo_cases(seed)
    if exercise == "A8.3":
        rng = np.random.default_rng(803 + (seed or 0))
        return [_room_case(rng) for _ in range(3)]
    rng = np.random.default_rng(808 + (seed or 0))
    return [
        _stats_case(rng),
        _hot_case(rng),
        _space_case(rng),
    ]  # the acceptance first: it names the mistake
