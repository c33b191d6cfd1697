"""Lecture 13's strategies run on real engines send exactly the bytes the simulator puts on its links.

Reference: the execution simulator's messages (``Simulation.bytes_sent``) for the same
configurations, against the communicator's counters of a real step on two gloo engines. The only
difference allowed is the pipeline's 64-byte header announcing the activations' shape (stage 0
sends it once a step; the simulator models payloads only). Bad names and sizes name the fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.op_costs import FlopsCosts
from course_lib.cost_model.simulator import Simulator
from course_lib.parallel.strategy_runs import (
    ALL_STRATEGIES,
    run_strategy,
    simulator_options,
    strategy_configs,
)
from course_lib.parallel.strategy_weights import one_process_weights, whole_weights
from course_lib.training.operator_graphs import kit_graph

SHAPE_HEADER = 64  # pipeline_step's first message of a step: 8 int64


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cl = shared_engines(2)  # from the session's pool (tests/conftest.py)
    setup_communicators(cl, backend="gloo", timeout=30)
    return cl


@pytest.mark.parametrize("name", ALL_STRATEGIES)
@pytest.mark.parametrize("model, batch", [("mlp", 16), ("lenet", 32), ("small_cnn", 8)])
def test_a_strategy_sends_the_simulators_bytes(cluster, name, model, batch):
    if name == "attribute" and model == "mlp":
        with pytest.raises(Exception, match="has none"):  # no convolutions to run data parallel
            cluster.run(run_strategy, name, "comm", model, batch, 1, timeout=120)
        return
    graph = kit_graph(model, batch)
    link = LinkModel(1e-5, 1e-9)
    sim = Simulator(graph, 2, FlopsCosts(1e9), link, **simulator_options(name))
    simulated = sim.run(strategy_configs(name, graph, 2))
    predicted, messages = simulated.bytes_sent(), simulated.messages_sent()
    runs = cluster.run(run_strategy, name, "comm", model, batch, 1, timeout=120)
    for rank, run in enumerate(runs):
        header = SHAPE_HEADER if name == "pipeline" and rank == 0 else 0
        assert run["bytes_sent"] == predicted.get(rank, 0.0) + header, (name, rank)
        assert run["messages_sent"] == messages.get(rank, 0) + (header > 0), (name, rank)
        assert len(run["walls"]) == 1 and run["walls"][0] > 0
        assert all(0 <= start <= end for start, end, _ in run["phases"])


def test_a_strategy_that_does_not_exist_or_fit_names_the_fix():
    graph = kit_graph("lenet", 32)
    with pytest.raises(ValueError, match="choose one of"):
        strategy_configs("zero", graph, 2)
    with pytest.raises(ValueError, match="run it on 2 engines"):
        strategy_configs("pipeline", graph, 4)


RTOL = 1e-5  # float32: N means of B/N samples summed in another order than one mean of B


def relative_error(got, want) -> float:
    """Return the largest |got - want| / max|want| over the tensors."""
    assert set(got) == set(want)
    return max(float(np.abs(got[k] - want[k]).max() / np.abs(want[k]).max()) for k in want)


@pytest.mark.parametrize(
    "name, optimizer", [(n, "sgd") for n in ALL_STRATEGIES] + [("zero2", "adam"), ("zero3", "adam")]
)
def test_every_strategy_trains_the_weights_one_process_trains(cluster, name, optimizer):
    # The same computation (source 003): after 1 + 3 updates on the same global batch, the
    # pieces every rank holds, put together, are one process's weights.
    # Adam at a large rate divides the rounding difference of a near-zero gradient by its own
    # size: at lr 0.05 plain data parallelism and ZeRO alike move 3 of 7 680 dense weights
    # 1.4e-3 (relative) away from one process (measured); at 1e-3 they agree to 2.4e-6.
    model, batch, steps, lr = "lenet", 32, 3, 0.05 if optimizer == "sgd" else 1e-3
    runs = cluster.run(
        run_strategy, name, "comm", model, batch, steps, lr=lr, optimizer=optimizer,
        bucket_bytes=1024, timeout=120,
    )  # fmt: skip
    got, disagreement = whole_weights(model, runs)
    assert disagreement == 0.0  # replicas of one value agree bit for bit
    want = one_process_weights(model, batch, steps, lr=lr, optimizer=optimizer)
    start = one_process_weights(model, batch, -1)  # 0 steps: the initial weights
    assert relative_error(want, start) > 1e-3  # the steps moved the weights
    err = relative_error(got, want)
    assert err <= RTOL, f"{name}: {err:.2e} from one process"


def test_engine_costs_time_each_shard_on_the_engines_as_many_at_once_as_its_workers(
    cluster, tmp_path
):
    # The fix of the scoreboard's 1 Gbit/s rows: a shard is timed on the engines, on as many
    # at once as its configuration spans (one worker: 1; data parallel, the replicated head of
    # the attribute split: 2), cached under the place and found again without timing.
    from course_lib.cost_model.configs import ParallelConfig
    from course_lib.cost_model.engine_costs import EngineCosts
    from course_lib.cost_model.op_costs import shard_signature

    graph = kit_graph("lenet", 32)
    names = ("one worker", "data parallel", "attribute")
    configs = [strategy_configs(n, graph, 2) for n in names]
    costs = EngineCosts("test engines", tmp_path / "costs.json", repeats=2)
    with pytest.raises(RuntimeError, match="measure"):
        costs(graph.ops[0], configs[0][0], graph.batch)
    wanted = {
        (shard_signature(op, cfg, graph.batch), cfg.degree)
        for strategy in configs
        for op, cfg in zip(graph.ops, strategy, strict=True)
        if op.kind != "flatten"
    }
    signatures_only = {sig for sig, _ in wanted}
    assert len(wanted) > len(signatures_only)  # the same shard alone and two at once: two keys
    assert costs.measure(cluster, "comm", graph, configs) == len(wanted)
    assert "on 2 engines (test engines)" in costs.machine
    values = {}
    for strategy in configs:
        for op, cfg in zip(graph.ops, strategy, strict=True):
            fwd, bwd = values[(op.name, cfg)] = costs(op, cfg, graph.batch)
            assert (fwd > 0 and bwd > 0) or op.kind == "flatten"
    again = EngineCosts("test engines", tmp_path / "costs.json", repeats=2)
    assert again.measure(cluster, "comm", graph, configs) == 0  # all cached
    for strategy in configs:
        for op, cfg in zip(graph.ops, strategy, strict=True):
            assert again(op, cfg, graph.batch) == values[(op.name, cfg)]
    assert again.measure(cluster, "comm", graph, configs, refresh=True) == len(wanted)
    linear = next(op for op in graph.ops if op.kind == "linear")
    with pytest.raises(KeyError, match="pass its strategy to measure"):
        again(linear, ParallelConfig("column", (0, 1)), graph.batch)


def test_the_scoreboards_figures_come_from_its_rows():
    # bench/bench_strategy_scoreboard.py's summary: median |error| (all rows, rows >= 1 MB),
    # Spearman, and the pick (the least predicted) measured against the measured best.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "bench" / "bench_strategy_scoreboard.py"
    spec = importlib.util.spec_from_file_location("scoreboard", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [  # predicted, measured, bytes sent: "a" predicted best, "b" measured best
        {"model": "m", "batch": 8, "strategy": "a", "predicted": 1.0, "measured": 1.2, "sent": 0},
        {"model": "m", "batch": 8, "strategy": "b", "predicted": 1.1, "measured": 1.0, "sent": 2e6},
        {"model": "m", "batch": 8, "strategy": "c", "predicted": 3.0, "measured": 4.0, "sent": 3e6},
    ]
    f = bench._figures(rows, "predicted")
    assert f["median"] == pytest.approx(1 / 6)  # errors 1/6, 1/10, 1/4
    assert f["median_1mb"] == pytest.approx((0.1 + 0.25) / 2)
    assert f["rho"] == pytest.approx(0.5)  # predicted order a b c, measured b a c
    pick, best, slower = f["picks"][("m", 8)]
    assert (pick, best) == ("a", "b") and slower == pytest.approx(0.2)
