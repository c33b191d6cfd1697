"""Assignment A8.3: A strategy chosen for a room with the simulator, then measured on two engines.

A8.3 asks a student's ``choose_strategy(simulate, choices, memory, budget, rng)`` for a strategy
of the kit's MLP in a room (2 PCs, a link rate, a memory per PC with Adam's state). The grade
is decided on the simulator's times; :func:`measure_pick` is the step after it that the lecture's
title asks for: it asks the answer for a pick in one such room (the kit's simulator behind
``simulate``), runs the pick on two local engines in interleaved rounds beside data parallelism
when the engines can run it (one of lecture 13's strategies, or a mixture of sample splits and
replicas: :mod:`course_lib.parallel.strategy_mixed`), and returns the lines
to print: the pick, predicted beside measured, and the sentence :mod:`course_lib.timing` draws.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

__all__ = ["measure_pick", "room_simulator"]


def room_simulator(batch: int, bytes_per_s: float):
    """Return the simulator of the MLP on 2 PCs: FLOP costs at 10 GFLOP/s, α 50 µs, Adam counted."""
    from course_lib.cost_model.alpha_beta import LinkModel
    from course_lib.cost_model.op_costs import FlopsCosts
    from course_lib.cost_model.simulator import Simulator
    from course_lib.training.operator_graphs import kit_graph

    return Simulator(
        kit_graph("mlp", batch), 2, FlopsCosts(1e10), LinkModel(50e-6, 1 / bytes_per_s),
        optimizer_bytes=8,
    )  # fmt: skip


def measure_pick(
    choose_strategy: Callable, batch: int = 64, bytes_per_s: float = 125e6, *, rounds: int = 3
) -> list[str]:
    """Ask ``choose_strategy`` for a pick in one room, run it beside data parallelism; return lines."""
    import numpy as np

    from course_lib import timing
    from course_lib.cluster import start_cluster
    from course_lib.comm import setup_communicators
    from course_lib.cost_model.search import search_space
    from course_lib.parallel.strategy_mixed import runnable
    from course_lib.parallel.strategy_runs import strategy_configs
    from course_lib.parallel.strategy_verdicts import pick_sentence, scoreboard

    sim = room_simulator(batch, bytes_per_s)
    space = search_space(sim)
    runs = {}

    def simulate(strategy):
        s = tuple(int(v) for v in strategy)
        if s not in runs:
            run = sim.run(tuple(c[i] for c, i in zip(space, s, strict=True)))
            runs[s] = (run.step_time, max(run.peak_memory().values()))
        return runs[s]

    peaks = [simulate(s)[1] for s in itertools.product(*(range(len(c)) for c in space))]
    fastest = min(runs, key=lambda s: runs[s][0])
    memory = (min(peaks) + runs[fastest][1]) / 2  # the rule of A8.3's rooms, at its middle
    runs.clear()
    pick = tuple(int(v) for v in choose_strategy(
        simulate, tuple(len(c) for c in space), memory, 800, np.random.default_rng(0)
    ))  # fmt: skip
    configs = tuple(c[i] for c, i in zip(space, pick, strict=True))
    t, need = simulate(pick)
    lines = [
        f"room: batch {batch}, {bytes_per_s / 1e6:g} MB/s, 2 PCs of {memory / 1e3:.1f} kB",
        "your pick: " + " ".join(f"{op.name}:{c}" for op, c in zip(sim.graph.ops, configs, strict=True)),
        f"  PREDICTED {t * 1e3:.3f} ms a step, {need / 1e3:.1f} kB per PC "
        f"({'fits' if need <= memory else 'does NOT fit'})",
    ]  # fmt: skip
    named = [n for n in ("one worker", "data parallel", "hybrid", "pipeline")
             if strategy_configs(n, sim.graph, 2) == configs]  # fmt: skip
    reason = None if named else runnable(configs, 2)
    if reason:
        return [*lines, f"the engines cannot run it: {reason}"]
    dp = strategy_configs("data parallel", sim.graph, 2)
    predicted = {"your pick": t, "data parallel": sim.run(dp).step_time}
    what = named[0] if named else configs  # a named strategy runs by its own code
    with start_cluster(n=2, seed=0) as cluster:
        setup_communicators(cluster, backend="gloo", timeout=60)
        board = scoreboard(
            cluster, {"your pick": what, "data parallel": "data parallel"}, "mlp", batch,
            rounds=rounds,
        )  # fmt: skip
    measured = {n: board[n]["spread"] for n in board}
    for n in board:
        lines.append(
            f"  {n:14s} PREDICTED {predicted[n] * 1e3:.3f} ms, MEASURED {measured[n].describe()}"
        )
    return [*lines, timing.load_line(), pick_sentence(predicted, measured)]
