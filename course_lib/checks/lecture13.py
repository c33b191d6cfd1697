"""Checks for the exercises of lecture 13 (choosing a strategy: the simulator and the search).

- 13.1 the messages a column-parallel linear layer needs when its input is split by samples,
  forward and backward, against the simulator's task graph;
- 13.2 the Metropolis-Hastings acceptance step, a statistical check with seeded generators;
- 13.3 a two-stage pipeline's step time by hand, against the simulator.

13.1 and 13.3 ask for work the simulator does: while the student's function runs, the
simulator is switched off (its entry points raise), so an answer that only calls it fails and
says why. The references are computed before.
Kept whole: three exercises of one lecture sharing the switched-off simulator, each a short
section of cases, reference and the messages that name the mistake (translatable templates).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator

from course_lib.checks.verdict import Verdict, run_check
from course_lib.cost_model import simulator as _simulator
from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.configs import ParallelConfig
from course_lib.cost_model.op_costs import FlopsCosts
from course_lib.cost_model.operators import build_graph
from course_lib.cost_model.simulator import Simulator
from course_lib.cost_model.task_graph import TaskGraphBuilder
from course_lib.i18n import N_, _

__all__ = [
    "check_accept",
    "check_column_messages",
    "check_pipeline_time",
    "column_messages_reference",
    "pipeline_time_reference",
]

_OFF = "course_lib's simulator is switched off while this check runs your function"


def _switched_off(*args, **kwargs):
    raise RuntimeError("course_lib's simulator is switched off while this check runs your function")


@contextlib.contextmanager
def _simulator_off() -> Iterator[None]:
    """Make the simulator's entry points raise, for every reference to them, then restore them."""
    targets = [
        _simulator.simulate,
        _simulator.simulate_delta,
        Simulator.run,
        Simulator.delta,
        TaskGraphBuilder.build,
    ]
    saved = [f.__code__ for f in targets]
    try:
        for f in targets:
            f.__code__ = _switched_off.__code__
        yield
    finally:
        for f, code in zip(targets, saved, strict=True):
            f.__code__ = code


def _by_hand(fn: Callable, *args):
    """Call ``fn(*args)`` with the simulator off; say so if the answer leaned on it."""
    try:
        with _simulator_off():
            return fn(*args)
    except RuntimeError as exc:
        if _OFF in str(exc):
            raise AssertionError(
                _(
                    "your function calls the simulator; this exercise asks you to work it out "
                    "by hand (the check switches the simulator off while yours runs)"
                )
            ) from None
        raise


# ---- Exercise 13.1: the messages of a column-parallel layer --------------------------------
def column_messages_reference(batch: int, n_in: int, n_out: int, world_size: int):
    """Return the simulator's (forward, backward) messages ``{(src, dst): bytes}`` of 13.1."""
    layers = [("linear", n_in), ("linear", n_out), ("loss",)]
    graph = build_graph("column", (3,), layers, batch)
    devices = tuple(range(world_size))
    strategy = (
        ParallelConfig("sample", devices),
        ParallelConfig("column", devices),
        ParallelConfig("replicate", devices),
    )
    tasks = TaskGraphBuilder(graph, world_size, FlopsCosts(1e9), LinkModel(1e-5, 1e-9)).build(
        strategy
    )
    out: tuple[dict, dict] = ({}, {})
    for t in tasks.values():
        if t.id.startswith("001x"):  # the edge into operator 1, the column-parallel layer
            src, dst = (int(v) for v in t.id.split(":")[1].split(">"))
            out[t.id[4] == "b"][(src, dst)] = t.nbytes
    return out


_COLUMN_CASES = [(8, 6, 4, 2), (12, 10, 6, 3), (32, 64, 12, 4), (64, 120, 84, 4)]


def _as_messages(got, what: str) -> dict:
    if not isinstance(got, dict):
        raise AssertionError(
            _("the {what} messages must be a dict {{(src, dst): bytes}}").format(what=what)
        )
    return {tuple(int(v) for v in k): float(b) for k, b in got.items() if b}


def _column_body(fn: Callable) -> str:
    for batch, n_in, n_out, n in _COLUMN_CASES:
        want = column_messages_reference(batch, n_in, n_out, n)
        got = _by_hand(fn, batch, n_in, n_out, n)
        if not isinstance(got, tuple) or len(got) != 2:
            raise AssertionError(_("return (forward, backward): two dicts {(src, dst): bytes}"))
        case = _("B={batch}, {n_in} -> {n_out}, {n} workers").format(
            batch=batch, n_in=n_in, n_out=n_out, n=n
        )
        for direction, g, w in zip((N_("forward"), N_("backward")), got, want, strict=True):
            what = _(direction)
            g = _as_messages(g, what)
            if set(g) == set(w) and all(math.isclose(g[k], b, rel_tol=1e-9) for k, b in w.items()):
                continue
            if any(s == d for s, d in g):
                raise AssertionError(
                    _("{case}: a worker sends to itself; its own rows are already there").format(
                        case=case
                    )
                )
            if not g and direction == "backward":
                raise AssertionError(
                    _(
                        "{case}: no backward messages; each worker's partial gradient of the "
                        "input rows goes back to the worker that holds those rows (summed there)"
                    ).format(case=case)
                )
            rows, whole = 4 * batch // n * n_in, 4 * batch * n_in
            if g and set(g.values()) == {whole}:
                raise AssertionError(
                    _(
                        "{case}, {what}: {whole} bytes a message is the whole input; each worker "
                        "holds only its own B/N rows ({rows} bytes) and sends those"
                    ).format(case=case, what=what, whole=whole, rows=rows)
                )
            if g and set(g.values()) <= {4 * batch // n * n_out, 4 * batch * n_out}:
                raise AssertionError(
                    _(
                        "{case}, {what}: those are output sizes; a column-parallel layer needs "
                        "the whole input X (every row, every feature) on every worker"
                    ).format(case=case, what=what)
                )
            if set(g) != set(w):
                missing = sorted(set(w) - set(g))[:3]
                raise AssertionError(
                    _(
                        "{case}, {what}: every worker needs every other worker's rows "
                        "({count} messages); missing e.g. {missing}"
                    ).format(case=case, what=what, count=n * (n - 1), missing=missing)
                )
            for k, b in w.items():
                if not math.isclose(g[k], b, rel_tol=1e-9):
                    raise AssertionError(
                        _("{case}, {what}: {pair} sends {got} bytes, want {want}").format(
                            case=case, what=what, pair=k, got=f"{g[k]:.0f}", want=f"{b:.0f}"
                        )
                    )
    return _("{n} cases, 2..4 workers: the simulator's messages, byte for byte").format(
        n=len(_COLUMN_CASES)
    )


def check_column_messages(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 13.1: ``fn(batch, n_in, n_out, world_size) -> (forward, backward)``."""
    return run_check("13.1", "column-parallel messages", lambda: _column_body(fn), verbose=verbose)


# ---- Exercise 13.2: the Metropolis-Hastings acceptance step -----------------------------------
_ACCEPT_CASES = [  # (t_cur, t_new, beta)
    (1.0, 0.8, 5.0),
    (1.0, 1.0, 5.0),
    (1.0, 1.05, 5.0),
    (1.0, 1.2, 5.0),
    (1.0, 1.2, 1.0),
    (1.0, 2.0, 5.0),
    (0.002, 0.0024, 2500.0),
]
_DRAWS = 3000


def _frequency(fn: Callable, case: tuple, seed: int) -> tuple[float, list[bool]]:
    rng = random.Random(seed)
    decisions = [bool(fn(*case, rng)) for _draw in range(_DRAWS)]
    return sum(decisions) / _DRAWS, decisions


def _accept_body(fn: Callable) -> str:
    freq, expected = {}, {}
    for k, case in enumerate(_ACCEPT_CASES):
        t_cur, t_new, beta = case
        expected[case] = min(1.0, math.exp(-beta * (t_new - t_cur)))
        freq[case], first = _frequency(fn, case, 1000 + k)
        random.random()  # move the global generator: an answer that uses it changes
        if _frequency(fn, case, 1000 + k)[1] != first:
            raise AssertionError(
                _(
                    "two runs with the same seeded rng decided differently: draw only from the "
                    "rng you are given (rng.random()), so a seeded search is reproducible"
                )
            )
    better = [c for c in _ACCEPT_CASES if c[1] <= c[0]]
    worse = [c for c in _ACCEPT_CASES if c[1] > c[0]]
    if any(freq[c] < 1.0 for c in better):
        raise AssertionError(
            _("a strategy that is not slower was sometimes rejected; it must always be accepted")
        )
    if all(freq[c] == 0.0 for c in worse):
        raise AssertionError(
            _(
                "you never accept a slower strategy (greedy descent): Metropolis-Hastings "
                "accepts one with probability exp(-beta * (t_new - t_cur)), which lets the walk "
                "leave a local optimum"
            )
        )
    if all(freq[c] == 1.0 for c in worse):
        raise AssertionError(
            _(
                "you accept every slower strategy: the probability must fall as t_new - t_cur "
                "grows, exp(-beta * (t_new - t_cur))"
            )
        )
    a, b = (1.0, 1.2, 5.0), (1.0, 1.2, 1.0)
    if abs(freq[a] - freq[b]) < 0.1:
        raise AssertionError(
            _(
                "the same slowdown was accepted as often at beta = 5 as at beta = 1: the "
                "acceptance must depend on beta (the inverse temperature)"
            )
        )
    for c in worse:
        p = expected[c]
        tol = 4.5 * math.sqrt(p * (1 - p) / _DRAWS) + 1e-12
        if abs(freq[c] - p) > tol:
            raise AssertionError(
                _(
                    "t_cur={t_cur}, t_new={t_new}, beta={beta}: accepted {freq} of {draws} "
                    "proposals, expected exp(-beta * dt) = {p}"
                ).format(
                    t_cur=c[0],
                    t_new=c[1],
                    beta=c[2],
                    freq=f"{freq[c]:.3f}",
                    draws=_DRAWS,
                    p=f"{p:.3f}",
                )
            )
    return _("{n} cases x {draws} seeded draws within 4.5 sigma of min(1, e^(-beta dt))").format(
        n=len(_ACCEPT_CASES), draws=_DRAWS
    )


def check_accept(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 13.2: ``fn(t_cur, t_new, beta, rng) -> bool``, statistically."""
    return run_check(
        "13.2", "Metropolis-Hastings acceptance", lambda: _accept_body(fn), verbose=verbose
    )


# ---- Exercise 13.3: a two-stage pipeline's step time by hand ----------------------------------
def pipeline_time_reference(
    batch: int, n_in: int, n_out: int, costs: dict, link: LinkModel
) -> float:
    """Return the simulator's step time of 13.3: the linear layer on worker 0, the loss on 1."""
    graph = build_graph("pipeline", (n_in,), [("linear", n_out), ("loss",)], batch)
    strategy = (ParallelConfig("replicate", (0,)), ParallelConfig("replicate", (1,)))
    sim = Simulator(graph, 2, lambda op, cfg, b: tuple(costs[op.kind]), link)
    return sim.run(strategy).step_time


_PIPELINE_CASES = [
    (64, 64, 10, {"linear": (1e-3, 2e-3), "loss": (1e-4, 5e-5)}, LinkModel(5e-5, 1 / 117e6)),
    (32, 784, 128, {"linear": (4e-3, 9e-3), "loss": (2e-4, 1e-4)}, LinkModel(1e-4, 1e-8)),
    (16, 8, 4, {"linear": (2e-5, 3e-5), "loss": (1e-5, 1e-5)}, LinkModel(1e-3, 1e-6)),
]


def _pipeline_mistakes(batch, n_in, n_out, costs, link) -> dict[str, float]:
    """Return the step time each tempting mistake gives, by the mistake's description."""
    a, b = link.alpha, link.beta
    compute = sum(sum(v) for v in costs.values())
    half_in, whole_in, act = 4 * batch // 2 * n_in, 4 * batch * n_in, 4 * batch * n_out
    right = compute + 3 * a + b * (half_in + 2 * act)
    return {
        _(
            "worker 1 loaded half of the samples: they travel to worker 0 before the first "
            "forward (a message of B/2 rows)"
        ): compute + 2 * a + 2 * act * b,
        _(
            "worker 0 already holds its own half of the samples: only the other half travels"
        ): compute + 3 * a + b * (whole_in + 2 * act),
        _(
            "the loss's gradient travels back to worker 0 before the linear layer's backward"
        ): compute + 2 * a + b * (half_in + act),
        _(
            "the labels travel at the start, on the other direction's link, while the samples "
            "do: they are not on the critical path"
        ): right + a + 4 * batch * b,
    }


def _pipeline_body(fn: Callable) -> str:
    for batch, n_in, n_out, costs, link in _PIPELINE_CASES:
        want = pipeline_time_reference(batch, n_in, n_out, costs, link)
        got = float(_by_hand(fn, batch, n_in, n_out, dict(costs), link))
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        case = f"B={batch}, {n_in} -> {n_out}"
        for mistake, value in _pipeline_mistakes(batch, n_in, n_out, costs, link).items():
            if math.isclose(got, value, rel_tol=1e-9):
                raise AssertionError(
                    _("{case}: {got} ms; {mistake}").format(
                        case=case, got=f"{got * 1e3:.4f}", mistake=mistake
                    )
                )
        raise AssertionError(
            _("{case}: got {got} ms, the simulator says {want} ms").format(
                case=case, got=f"{got * 1e3:.4f}", want=f"{want * 1e3:.4f}"
            )
        )
    return _("{n} cases equal the simulator's step time").format(n=len(_PIPELINE_CASES))


def check_pipeline_time(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 13.3: ``fn(batch, n_in, n_out, costs, link) -> seconds``."""
    return run_check("13.3", "pipeline step time", lambda: _pipeline_body(fn), verbose=verbose)
