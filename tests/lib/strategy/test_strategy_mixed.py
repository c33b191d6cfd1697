"""The search's pick (sample-split convolutions, a replicated head) runs on engines as the simulator models it.

Reference: the execution simulator's messages for the same configurations against the
communicator's counters on two gloo engines, and one process's weights after the same SGD steps.
"""

from __future__ import annotations

import pytest

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.configs import ParallelConfig
from course_lib.cost_model.op_costs import FlopsCosts
from course_lib.cost_model.simulator import Simulator
from course_lib.parallel.strategy_mixed import run_configs, runnable
from course_lib.parallel.strategy_weights import one_process_weights, whole_weights
from course_lib.training.operator_graphs import kit_graph
from tests.lib.strategy.test_strategy_runs import RTOL, relative_error

S, R = ParallelConfig("sample", (0, 1)), ParallelConfig("replicate", (0, 1))


def mixtures(graph):
    flat = next(i for i, op in enumerate(graph.ops) if op.kind == "flatten")
    n = len(graph.ops)
    return {
        "search pick": tuple(S if i <= flat else R for i in range(n)),  # lecture 13's find
        "replicated convolutions": tuple(R if i < flat else S for i in range(n)),
        "alternating": tuple(S if i % 2 else R for i in range(n)),
    }


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cl = shared_engines(2)
    setup_communicators(cl, backend="gloo", timeout=30)
    return cl


@pytest.mark.parametrize("which", ["search pick", "replicated convolutions", "alternating"])
def test_a_mixture_sends_the_simulators_bytes_and_trains_one_process_weights(cluster, which):
    model, batch, steps, lr = "lenet", 16, 2, 0.05
    graph = kit_graph(model, batch)
    configs = mixtures(graph)[which]
    sim = Simulator(graph, 2, FlopsCosts(1e9), LinkModel(1e-5, 1e-9), sync="after_backward")
    simulated = sim.run(configs)
    runs = cluster.run(run_configs, configs, "comm", model, batch, steps, lr=lr, timeout=120)
    for rank, run in enumerate(runs):
        assert run["bytes_sent"] == simulated.bytes_sent().get(rank, 0.0), (which, rank)
        assert run["messages_sent"] == simulated.messages_sent().get(rank, 0), (which, rank)
    got, disagreement = whole_weights(model, runs)
    assert disagreement == 0.0
    err = relative_error(got, one_process_weights(model, batch, steps, lr=lr))
    assert err <= RTOL, f"{which}: {err:.2e} from one process"


def test_a_configuration_the_engines_cannot_run_is_named():
    graph = kit_graph("lenet", 16)
    col = tuple(ParallelConfig("column", (0, 1)) for _ in graph.ops)
    assert "sample splits and replicas" in runnable(col, 2)
    assert runnable(mixtures(graph)["search pick"], 2) is None
    half = (ParallelConfig("replicate", (0,)),) * len(graph.ops)
    assert "over all 2 workers" in runnable(half, 2)


def test_the_megatron_pair_alone_trains_an_mlp_as_one_process(cluster):
    # A8.3's picks on the MLP are often lecture 9's column -> row pair (the "hybrid" without
    # convolutions): it runs, and trains one process's weights.
    from course_lib.parallel.strategy_runs import run_strategy

    model, batch, steps, lr = "mlp", 16, 2, 0.05
    runs = cluster.run(run_strategy, "hybrid", "comm", model, batch, steps, lr=lr, timeout=120)
    got, disagreement = whole_weights(model, runs)
    assert disagreement == 0.0
    assert relative_error(got, one_process_weights(model, batch, steps, lr=lr)) <= RTOL
