"""Checks of assignment A8 (choosing a strategy: an attribute split's halo, a Metropolis-Hastings search).

No engines: both exercises are judged against the kit's execution simulator
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

Typical mistakes fail with a reason naming them: a halo for an edge worker's missing neighbour,
float64 bytes, no backward messages, exp(+beta delta), a best that is only the last state.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from course_lib.checks.verdict import Verdict, run_check

__all__ = [
    "A8_DETAILS",
    "A8_POINTS",
    "a8_body",
    "a8_cases",
    "check_halo_messages",
    "check_mh_search",
    "simulated_halo",
    "strategy_table",
]

A8_POINTS = {"A8.1": 5.0, "A8.2": 5.0}
A8_DETAILS = {
    "A8.1": "forward halos and backward gradients equal to the simulator's task graph",
    "A8.2": "the walk's time at each level as exp(-beta t), the best seen kept on a hot walk, "
    "the exhaustive optimum found",
}
BYTES = 4  # float32
STATS_LEVELS = 3
STATS_ITERATIONS = 20_000
STATS_TOLERANCE = 0.04  # on each level's fraction of the walk (about 5 standard errors)

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
    rng = np.random.default_rng(808 + (seed or 0))
    return [
        _stats_case(rng),
        _hot_case(rng),
        _space_case(rng),
    ]  # the acceptance first: it names the mistake


# -- A8.1 ------------------------------------------------------------------------------------
def _messages(got, what: str, workers: int) -> dict:
    """Return ``{(src, dst): bytes}`` from a list of (src, dst, bytes); refuse what is not."""
    if got is None or isinstance(got, (str, bytes)) or not hasattr(got, "__len__"):
        raise AssertionError(f"the {what} messages must be a list of (src, dst, bytes) tuples")
    out: dict = {}
    for m in got:
        try:
            src, dst, nbytes = (float(v) for v in np.asarray(m, dtype=float).reshape(-1))
        except (ValueError, TypeError):
            raise AssertionError(
                f"each {what} message must be a (src, dst, bytes) tuple of numbers, got {m!r}"
            ) from None
        src, dst = int(src), int(dst)
        if not (0 <= src < workers and 0 <= dst < workers):
            raise AssertionError(
                f"{what} message {src} -> {dst}: there is no worker {dst if 0 <= src else src} "
                f"(workers 0..{workers - 1}); an edge worker has one neighbour only, the image's "
                "top and bottom rows are padding, not a halo"
            )
        if src == dst:
            raise AssertionError(f"{what} message {src} -> {dst}: a worker does not send to itself")
        if (src, dst) in out:
            raise AssertionError(
                f"two {what} messages {src} -> {dst}: send the whole halo as one message per "
                "neighbour and pass (as the simulator does)"
            )
        out[(src, dst)] = nbytes
    return out


def _where(case: dict) -> str:
    return (
        f"batch {case['batch']}, {case['channels']} x {case['height']} x {case['width']} input, "
        f"{case['kernel']}x{case['kernel']} kernel, padding {case['padding']}, "
        f"stride {case['stride']}, {case['workers']} workers"
    )


def _compare(got: dict, want: dict, what: str, case: dict) -> None:
    n, where = case["workers"], _where(case)
    row = BYTES * case["batch"] * case["channels"] * case["width"]  # one input row, float32
    if want and not got:
        if what == "backward":
            raise AssertionError(
                f"no backward messages ({where}): the gradient of every halo row travels back "
                "to the worker that holds the row (the same bytes, dst -> src)"
            )
        raise AssertionError(f"no forward messages ({where}), but the simulator sends {want}")
    if (
        got
        and want
        and all(got.get(k) == 2 * v for k, v in want.items())
        and got.keys() == want.keys()
    ):
        raise AssertionError(
            f"{what} bytes are twice the simulator's ({where}): float64; the kit's activations "
            "and gradients are float32, 4 bytes each"
        )
    reversed_ = {(d, s): b for (s, d), b in got.items()}
    if what == "backward" and got != want and reversed_ == want:
        raise AssertionError(
            f"the backward messages go the wrong way ({where}): a halo row's gradient goes back "
            "from the worker that used it to the worker that holds the row"
        )
    for s, d in sorted(got):
        if (s, d) not in want:
            hint = (
                ": workers 0 and the last are not neighbours; an edge worker has a halo on one "
                "side only"
                if {s, d} == {0, n - 1} and n > 2
                else ""
            )
            raise AssertionError(
                f"{what} message {s} -> {d} ({where}), but the simulator sends none: worker "
                f"{d if what == 'forward' else s}'s output rows need none of worker "
                f"{s if what == 'forward' else d}'s input rows{hint}"
            )
    for (s, d), nbytes in sorted(want.items()):
        if (s, d) not in got:
            raise AssertionError(
                f"no {what} message {s} -> {d} ({where}): the simulator sends {nbytes} bytes "
                f"({nbytes // row} rows of batch x channels x width float32)"
            )
        if got[(s, d)] != nbytes:
            k, p = case["kernel"], case["padding"]
            hint = (
                f"; with padding {p} != {k // 2} the halo is not k // 2 rows on each side: worker "
                "j needs input rows [o0 * stride - padding, (o1 - 1) * stride - padding + kernel) "
                "clipped to the image, for its output rows [o0, o1)"
                if p != k // 2 or case["stride"] > 1
                else ""
            )
            raise AssertionError(
                f"{what} message {s} -> {d} ({where}): {got[(s, d)]:g} bytes, the simulator "
                f"sends {nbytes} ({nbytes // row} rows of {row} bytes){hint}"
            )


def _judge_halo(answer: Callable, case: dict) -> None:
    got = answer()
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError("halo_messages must return a tuple (forward, backward)")
    forward, backward = (
        _messages(g, w, case["workers"]) for g, w in zip(got, ("forward", "backward"), strict=True)
    )
    want_f, want_b = simulated_halo(**case)
    _compare(forward, want_f, "forward", case)
    _compare(backward, want_b, "backward", case)


# -- A8.2 ------------------------------------------------------------------------------------
def _judge_space(got, case: dict) -> None:
    table = np.asarray(case["table"], dtype=float)
    best, best_time, walk = got
    best = tuple(int(v) for v in np.asarray(best).reshape(-1))
    walk = np.asarray(walk, dtype=float).reshape(-1)
    if len(best) != table.ndim or any(
        not 0 <= b < n for b, n in zip(best, table.shape, strict=True)
    ):
        raise AssertionError(
            f"best must be a strategy: one configuration index per operator, "
            f"{table.ndim} indices below {table.shape}; got {best}"
        )
    if len(walk) != case["iterations"]:
        raise AssertionError(
            f"the walk has {len(walk)} entries for {case['iterations']} iterations: record the "
            "current strategy's time after every iteration"
        )
    values = np.unique(table)
    if not np.all(np.isin(walk, values)):
        raise AssertionError("the walk holds times that no strategy has: record cost(current)")
    if not math.isclose(float(best_time), float(table[best]), rel_tol=1e-12):
        raise AssertionError(
            f"best_time {float(best_time):.6g} s is not the cost of best ({table[best]:.6g} s)"
        )
    seen = min(float(table[tuple(case["start"])]), float(walk.min()))
    if float(best_time) > seen:
        raise AssertionError(
            f"not keeping the best seen: the walk reached {seen * 1e3:.4f} ms but best is "
            f"{float(best_time) * 1e3:.4f} ms (the last state, not the best one, is returned?)"
        )
    if float(best_time) > table.min():
        raise AssertionError(
            f"after {case['iterations']} proposals on {table.size} strategies the best is "
            f"{float(best_time) * 1e3:.4f} ms, the exhaustive optimum {table.min() * 1e3:.4f} ms"
        )


def _judge_levels(got, case: dict) -> None:
    table = np.asarray(case["table"], dtype=float)
    walk = np.asarray(got[2], dtype=float).reshape(-1)
    if len(walk) != case["iterations"]:
        raise AssertionError(
            f"the walk has {len(walk)} entries for {case['iterations']} iterations: record the "
            "current strategy's time after every iteration"
        )
    level = np.abs(walk[:, None] - table[None, :]).argmin(axis=1)
    frac = np.bincount(level, minlength=len(table)) / len(walk)
    weights = np.exp(-case["beta"] * (table - table[0]))
    want = weights / weights.sum()
    shown = f"fractions of the walk at t0, t0 + d, t0 + 2d: {np.round(frac, 3).tolist()}"
    if np.all(np.abs(frac - want) <= STATS_TOLERANCE):
        return
    rate = math.exp(-case["beta"] * (table[1] - table[0]))
    if np.all(np.abs(frac - 1 / len(table)) <= STATS_TOLERANCE / 2):
        raise AssertionError(
            f"{shown}, nearly uniform: every worse move is accepted; accepting with exp(+beta "
            f"delta)? A move worse by delta > 0 is accepted with probability exp(-beta delta) "
            f"(here {rate:.2f} for one level), not min(1, exp(+beta delta)) = 1"
        )
    if frac[0] > 1 - STATS_TOLERANCE:
        raise AssertionError(
            f"{shown}: the walk never leaves the best state, so no worse move is accepted; "
            f"accept a move worse by delta with probability exp(-beta delta) ({rate:.2f} here)"
        )
    raise AssertionError(
        f"{shown}; the Boltzmann weights exp(-beta t) give {np.round(want, 3).tolist()} "
        f"(+-{STATS_TOLERANCE}): accept a move worse by delta with probability exp(-beta delta) "
        f"= {rate:.2f} for one level, every better or equal move always"
    )


def _judge_search(answer: Callable, case: dict) -> None:
    got = answer(case)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise AssertionError("mh_search must return a tuple (best, best_time, walk)")
    if case["what"] in ("space", "hot"):
        _judge_space(got, case)
    else:
        _judge_levels(got, case)


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


def a8_body(exercise: str, run_case: Callable, seed: int | None = None) -> str:
    """Run ``exercise``'s cases through ``run_case(case)`` and judge them; return the detail."""
    cases = a8_cases(exercise, seed)
    for case in cases:
        if exercise == "A8.1":
            _judge_halo(lambda case=case: run_case(case), case)
        else:
            _judge_search(run_case, case)
    if exercise == "A8.1":
        return f"{len(cases)} convolutions on 2-4 workers, {A8_DETAILS['A8.1']}"
    return f"3 levels and a space of {cases[2]['table'].size} strategies: {A8_DETAILS['A8.2']}"


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
