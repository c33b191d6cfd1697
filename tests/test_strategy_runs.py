"""Lecture 13's strategies run on real engines send exactly the bytes the simulator puts on its links.

Reference: the execution simulator's messages (``Simulation.bytes_sent``) for the same
configurations, against the communicator's counters of a real step on two gloo engines. The only
difference allowed is the pipeline's 64-byte header announcing the activations' shape (stage 0
sends it once a step; the simulator models payloads only). Bad names and sizes name the fix.
"""

from __future__ import annotations

import pytest

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.op_costs import FlopsCosts
from course_lib.cost_model.simulator import Simulator
from course_lib.parallel.strategy_runs import STRATEGIES, run_strategy, strategy_configs
from course_lib.training.operator_graphs import kit_graph

SHAPE_HEADER = 64  # pipeline_step's first message of a step: 8 int64


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cl = shared_engines(2)  # from the session's pool (tests/conftest.py)
    setup_communicators(cl, backend="gloo", timeout=30)
    return cl


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("model, batch", [("mlp", 16), ("lenet", 32), ("small_cnn", 8)])
def test_a_strategy_sends_the_simulators_bytes(cluster, name, model, batch):
    if (name, model) == ("hybrid", "mlp"):
        with pytest.raises(Exception, match="has none"):  # no convolutions to run data parallel
            cluster.run(run_strategy, name, "comm", model, batch, 1, timeout=120)
        return
    graph = kit_graph(model, batch)
    sim = Simulator(graph, 2, FlopsCosts(1e9), LinkModel(1e-5, 1e-9), sync="after_backward")
    predicted = sim.run(strategy_configs(name, graph, 2)).bytes_sent()
    runs = cluster.run(run_strategy, name, "comm", model, batch, 1, timeout=120)
    for rank, run in enumerate(runs):
        header = SHAPE_HEADER if name == "pipeline" and rank == 0 else 0
        assert run["bytes_sent"] == predicted.get(rank, 0.0) + header, (name, rank)
        assert len(run["walls"]) == 1 and run["walls"][0] > 0
        assert all(0 <= start <= end for start, end, _ in run["phases"])


def test_a_strategy_that_does_not_exist_or_fit_names_the_fix():
    graph = kit_graph("lenet", 32)
    with pytest.raises(ValueError, match="choose one of"):
        strategy_configs("zero", graph, 2)
    with pytest.raises(ValueError, match="run it on 2 engines"):
        strategy_configs("pipeline", graph, 4)
