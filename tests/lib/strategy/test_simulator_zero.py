"""ZeRO stages 1-3 in lecture 13's simulator, against lecture 11's formulas and the kit's own ZeRO.

References: the kit's unit plan (``plan_units``), the bytes auditor (``exact_values_sent``),
the memory formulas (``formula_bytes``: 16, 8 + 8/N, 4 + 12/N, 16/N bytes a value with float32
Adam), and, on 3 real gloo engines, the communicator's counters of bytes and messages and the
memory ledger of the kit's ZeRO exchanges (LeNet's 19 754 values: uneven shards on 3).
"""

from __future__ import annotations

import pytest

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.configs import ParallelConfig, data_parallel
from course_lib.cost_model.op_costs import FlopsCosts
from course_lib.cost_model.sharding import ZeroConfig, zero_units
from course_lib.cost_model.simulator import Simulator
from course_lib.parallel.sharded.audit import exact_values_sent, passes_per_step
from course_lib.parallel.sharded.ledger import formula_bytes
from course_lib.parallel.sharded.units import unit_sizes
from course_lib.parallel.strategy_runs import run_strategy, simulator_options, strategy_configs
from course_lib.training.models import build_model
from course_lib.training.operator_graphs import kit_graph

LINK = LinkModel(1e-5, 1e-9)
ADAM = 8  # bytes of optimiser state per value: Adam's two moments


def zero_sim(model: str, batch: int, n: int, stage: int, bucket_bytes: int = 1024):
    graph = kit_graph(model, batch)
    sim = Simulator(
        graph, n, FlopsCosts(1e9), LINK, "after_backward", ZeroConfig(stage, bucket_bytes), ADAM
    )
    return graph, sim.run(data_parallel(graph, n))


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("model, bucket_bytes", [("lenet", 1024), ("small_cnn", 1 << 16)])
def test_the_units_are_the_kits_units(model, bucket_bytes, stage):
    graph = kit_graph(model, 8)
    got = [u.numel for u in zero_units(graph, ZeroConfig(stage, bucket_bytes))]
    assert got == unit_sizes(build_model(model), stage, 2, bucket_bytes)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bytes_and_messages_are_the_auditors(stage, n):
    graph, run = zero_sim("lenet", 48, n, stage)
    units = unit_sizes(build_model("lenet"), stage, n, 1024)
    for rank in range(n):
        assert run.bytes_sent()[rank] == 4 * exact_values_sent(stage, units, rank, n)
        # every ring pass: N - 1 steps of one message per worker
        assert run.messages_sent()[rank] == passes_per_step(stage) * (n - 1) * len(units)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_memory_per_worker_is_the_formula(stage, n):
    graph, run = zero_sim("lenet", 48, n, stage)
    want = formula_bytes(stage, graph.params, n)  # 8 + 8/N, 4 + 12/N, 16/N bytes a value
    units = len(zero_units(graph, ZeroConfig(stage, 1024)))
    for rank in range(n):
        # shards are the ring's chunks: less than one value off the formula per unit and kind
        assert abs(run.state_bytes[rank] - want) < (8 + ADAM) * units
        assert run.peak_memory()[rank] > run.state_bytes[rank]  # plus the activations
    plain = Simulator(graph, n, FlopsCosts(1e9), LINK, "after_backward", optimizer_bytes=ADAM)
    assert plain.run(data_parallel(graph, n)).state_bytes[0] == formula_bytes(0, graph.params, n)


def test_stage_3_gathers_a_layer_before_its_forward_and_its_backward():
    graph, run = zero_sim("lenet", 48, 2, 3)
    for i, op in enumerate(graph.ops):
        if not op.has_params:
            continue
        for d in (0, 1):
            gathers = [t for t in run.tasks if t.startswith(f"{i:03d}Zf")]
            assert gathers and run.start[f"{i:03d}F{d}"] >= max(run.end[t] for t in gathers)
            back = [t for t in run.tasks if t.startswith(f"{i:03d}Zb")]
            assert back and run.start[f"{i:03d}B{d}"] >= max(run.end[t] for t in back)


def test_zero_needs_data_parallelism_and_a_stage():
    graph = kit_graph("lenet", 48)
    sim = Simulator(graph, 2, FlopsCosts(1e9), LINK, zero=ZeroConfig(2))
    one = tuple(ParallelConfig("replicate", (0,)) for _ in graph.ops)
    with pytest.raises(ValueError, match="split by samples.*data_parallel"):
        sim.run(one)
    with pytest.raises(ValueError, match="stages 1, 2 and 3"):
        ZeroConfig(0)


@pytest.fixture(scope="module")
def three(shared_engines):
    from course_lib.comm import setup_communicators

    cl = shared_engines(3)  # from the session's pool (tests/conftest.py)
    setup_communicators(cl, backend="gloo", timeout=30)
    return cl


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_kits_zero_on_three_engines_sends_and_holds_what_the_simulator_says(three, stage):
    name, graph = f"zero{stage}", kit_graph("lenet", 48)
    runs = three.run(
        run_strategy, name, "comm", "lenet", 48, 2, lr=1e-3, optimizer="adam",
        bucket_bytes=1024, timeout=120,
    )  # fmt: skip
    sim = Simulator(
        graph, 3, FlopsCosts(1e9), LINK, optimizer_bytes=ADAM, **simulator_options(name, 1024)
    ).run(strategy_configs(name, graph, 3))
    units = len(zero_units(graph, ZeroConfig(stage, 1024)))
    for rank, run in enumerate(runs):
        assert run["bytes_sent"] == sim.bytes_sent()[rank]
        assert run["messages_sent"] == sim.messages_sent()[rank]
        # the ledger counts Adam's step counter too: one float32 scalar per shard (per unit)
        assert run["ledger"]["ledger_settled_bytes"] == sim.state_bytes[rank] + 4 * units
