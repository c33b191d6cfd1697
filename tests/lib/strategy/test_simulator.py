"""Lecture 13's execution simulator against formulas: bytes, serial chains, links, rings, deltas.

References: the kit's own byte formulas for data parallelism and Krizhevsky's hybrid
(``course_lib.parallel.model_parallel.hybrid``, which the hybrid's tests check against the
communicator's counters on real engines) compared exactly; the alpha-beta formula of a ring
allreduce (``course_lib.cost_model.alpha_beta.predict``); sums of task costs; and the full
simulation as the reference of the delta one. Costs here come from FLOPs at an arbitrary rate
(the measured costs have their own test), so every expected time is exact arithmetic.
"""

from __future__ import annotations

import random

import pytest

from course_lib.cost_model.alpha_beta import LinkModel, predict
from course_lib.cost_model.configs import (
    ParallelConfig,
    check_strategy,
    data_parallel,
    expert_hybrid,
)
from course_lib.cost_model.messages import Network, Task, ring_allreduce_tasks
from course_lib.cost_model.op_costs import FlopsCosts, MeasuredCosts
from course_lib.cost_model.operators import alexnet_layers, build_graph
from course_lib.cost_model.search import search_space
from course_lib.cost_model.simulator import Simulator, simulate, simulate_delta
from course_lib.parallel.model_parallel.hybrid import data_parallel_bytes, hybrid_bytes, layer_sizes
from course_lib.training.models import MLP, LeNet, SmallCNN, param_count
from course_lib.training.operator_graphs import graph_of, kit_graph

LINK = LinkModel(alpha=1e-5, beta=1e-8)
COSTS = FlopsCosts(1e9)


def sim_of(graph, world_size, link=LINK, sync="per_operator"):
    return Simulator(graph, world_size, COSTS, link, sync)


@pytest.mark.parametrize("name, cls", [("mlp", MLP), ("lenet", LeNet), ("small_cnn", SmallCNN)])
def test_graph_holds_the_models_parameters(name, cls):
    assert kit_graph(name, 8).params == param_count(cls())


def test_alexnet_graph_has_alexnets_parameters():
    graph = build_graph("alexnet", (3, 224, 224), alexnet_layers(), 1)
    assert graph.params == 61_100_840  # torchvision's alexnet()
    assert graph.ops[graph.index("flatten1")].out_shape == (9216,)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ["mlp", "lenet", "small_cnn"])
def test_data_parallel_bytes_equal_the_rings(name, world_size):
    graph = kit_graph(name, 32)
    sent = sim_of(graph, world_size).run(data_parallel(graph, world_size)).bytes_sent()
    expected = data_parallel_bytes(graph.params, world_size)
    assert sent == {w: pytest.approx(expected, rel=1e-12) for w in range(world_size)}


def _part(tid: str, graph) -> str:
    """Return which part of hybrid_bytes a message belongs to, from its operator and kind."""
    if tid.startswith("S"):  # the one ring after the backward pass
        return "conv gradients"
    op = graph.ops[int(tid[:3])]
    first_linear = next(i for i, o in enumerate(graph.ops) if o.kind == "linear")
    if "G" in tid[3:5]:
        return "conv gradients"
    if tid[3] == "l":
        return "labels"
    if int(tid[:3]) == first_linear and tid[3] == "x":
        return "features"
    return "dense head" if op.kind in ("linear", "relu", "loss") else "other"


@pytest.mark.parametrize("sync", ["per_operator", "after_backward"])
@pytest.mark.parametrize("world_size, classes", [(2, 10), (4, 12)])
def test_hybrid_bytes_equal_the_kits_hybrid_part_by_part(world_size, classes, sync):
    net, batch = LeNet(num_classes=classes), 32
    graph = graph_of(net, (1, 8, 8), batch)
    sim = sim_of(graph, world_size, sync=sync).run(expert_hybrid(graph, world_size))
    parts = {}
    for t in sim.tasks.values():
        if t.device[0] == "link":
            parts[_part(t.id, graph)] = parts.get(_part(t.id, graph), 0.0) + t.nbytes / world_size
    expected = hybrid_bytes(batch, world_size, *layer_sizes(net))
    assert parts == {k: pytest.approx(v, rel=1e-12) for k, v in expected.items()}
    per_worker = sim.bytes_sent()
    assert len(set(per_worker.values())) == 1  # every worker sends the same


@pytest.mark.parametrize("world_size", [2, 4])
def test_data_parallel_after_backward_takes_compute_plus_the_rings_formula(world_size):
    graph = kit_graph("small_cnn", 32)
    strategy = data_parallel(graph, world_size)
    late = sim_of(graph, world_size, sync="after_backward").run(strategy)
    compute = sum(
        sum(COSTS(op, cfg, graph.batch)) for op, cfg in zip(graph.ops, strategy, strict=True)
    )
    ring = predict("ring_allreduce", 4 * graph.params, world_size, LINK)
    assert late.step_time == pytest.approx(compute + ring, rel=1e-12)
    early = sim_of(graph, world_size).run(strategy)  # per-operator rings overlap the backward
    assert compute < early.step_time < late.step_time
    assert early.bytes_sent() == pytest.approx(late.bytes_sent(), rel=1e-12)


def test_a_chain_on_one_worker_takes_the_sum_of_its_costs():
    graph = kit_graph("lenet", 16)
    strategy = tuple(ParallelConfig("replicate", (0,)) for _ in graph.ops)
    sim = sim_of(graph, 1).run(strategy)
    costs = [COSTS(op, cfg, graph.batch) for op, cfg in zip(graph.ops, strategy, strict=True)]
    assert sim.step_time == pytest.approx(sum(f + b for f, b in costs), rel=1e-12)
    assert not sim.bytes_sent()
    acts = sum(op.out_bytes(graph.batch) for op in graph.ops)
    assert sim.peak_memory() == {0: pytest.approx(2 * 4 * graph.params + acts)}


def test_the_hybrid_splits_the_dense_weights_and_data_parallelism_copies_them():
    net, world_size = LeNet(num_classes=12), 4
    graph = graph_of(net, (1, 8, 8), 32)
    sim = sim_of(graph, world_size)
    conv, (w0, w1, w2, w3) = layer_sizes(net)
    column1, row2, column3 = (w0 * w1 + w1) / 4, w1 // 4 * w2 + w2, (w2 * w3 + w3) / 4
    hybrid = sim.run(expert_hybrid(graph, world_size)).param_bytes
    assert hybrid == {w: 4 * (conv + column1 + row2 + column3) for w in range(world_size)}
    dp = sim.run(data_parallel(graph, world_size))
    assert dp.param_bytes == {w: 4 * graph.params for w in range(world_size)}
    assert max(dp.peak_memory().values()) > 2 * 4 * graph.params  # plus activations


def test_two_transfers_on_one_link_serialise_and_on_two_links_overlap():
    one = LINK.alpha + 1e6 * LINK.beta
    same = {
        t.id: t
        for t in [
            Task("a", ("link", 0, 1), one, nbytes=1e6),
            Task("b", ("link", 0, 1), one, nbytes=1e6),
        ]
    }
    apart = {
        t.id: t
        for t in [
            Task("a", ("link", 0, 1), one, nbytes=1e6),
            Task("b", ("link", 1, 0), one, nbytes=1e6),
        ]
    }
    assert simulate(same).step_time == pytest.approx(2 * one)
    assert simulate(apart).step_time == pytest.approx(one)
    worker = {t.id: t for t in [Task("f", ("worker", 0), 0.5), Task("g", ("worker", 0), 0.25)]}
    assert simulate(worker).step_time == pytest.approx(0.75)  # independent, yet one at a time


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_ring_allreduce_expands_into_its_messages_and_takes_the_formulas_time(world_size):
    devices, nbytes = tuple(range(world_size)), 4e6
    tasks, done = ring_allreduce_tasks("r", devices, nbytes, {d: [] for d in devices}, LINK)
    assert len(tasks) == 2 * (world_size - 1) * world_size
    assert {t.nbytes for t in tasks} == {nbytes / world_size}
    sim = simulate({t.id: t for t in tasks})
    assert sim.step_time == pytest.approx(predict("ring_allreduce", nbytes, world_size, LINK))
    assert set(done) == set(devices)


@pytest.mark.parametrize("topology", ["pairs", "nic", "bus"])
def test_the_topology_says_which_messages_share_a_wire(topology):
    world_size, nbytes = 4, 4e6
    devices = tuple(range(world_size))
    net = Network(LINK, topology)
    tasks, _ = ring_allreduce_tasks("r", devices, nbytes, {d: [] for d in devices}, net)
    one = LINK.alpha + nbytes / world_size * LINK.beta
    steps = 2 * (world_size - 1)
    # a ring sends one message per worker per step: only a shared bus serialises them
    expected = steps * one * (world_size if topology == "bus" else 1)
    assert simulate({t.id: t for t in tasks}).step_time == pytest.approx(expected)
    fan_out = {
        t.id: t for t in [Task("a", net.device(0, 1), one), Task("b", net.device(0, 2), one)]
    }
    assert simulate(fan_out).step_time == pytest.approx(one if topology == "pairs" else 2 * one)


def test_halo_exchange_of_an_attribute_split_sends_one_row_each_way():
    layers = [
        ("conv2d", 4, 3, 1, 1),
        ("relu",),
        ("conv2d", 4, 3, 1, 1),
        ("flatten",),
        ("linear", 10),
        ("loss",),
    ]
    graph, batch = build_graph("halo", (1, 8, 8), layers, 8), 8
    a, s = ParallelConfig("attribute", (0, 1)), ParallelConfig("sample", (0, 1))
    sim = sim_of(graph, 2).run((a, a, a, s, s, s))
    halo = {tid: t.nbytes for tid, t in sim.tasks.items() if tid.startswith("002x")}
    row = 4 * batch * 4 * 8  # float32 x batch x channels x width
    assert halo == {"002xf:0>1": row, "002xf:1>0": row, "002xb:0>1": row, "002xb:1>0": row}


def test_pipeline_stages_send_activations_forward_and_gradients_back():
    graph = kit_graph("mlp", 16)  # flatten, linear 64->128, relu, linear 128->10, loss
    w0, w1 = ParallelConfig("replicate", (0,)), ParallelConfig("replicate", (1,))
    sim = sim_of(graph, 2).run((w0, w0, w0, w1, w1))
    cut = 4 * 16 * 128
    sent = {tid: t.nbytes for tid, t in sim.tasks.items() if tid.startswith("003x")}
    assert sent == {"003xf:0>1": cut, "003xb:1>0": cut}


@pytest.mark.parametrize(
    "cfg, world_size, fix",
    [
        (
            ParallelConfig("column", (0, 1, 2)),
            4,
            "choose a degree in [1, 2]",
        ),  # 10 classes, 4 workers
        (ParallelConfig("sample", (0, 1, 2, 3, 4)), 4, "only 4 are given"),
        (ParallelConfig("row", (0, 1)), 2, "not a loss"),
    ],
)
def test_a_configuration_that_does_not_fit_names_the_fix(cfg, world_size, fix):
    graph = kit_graph("lenet", 30)
    strategy = list(data_parallel(graph, 1))
    where = len(graph.ops) - 2 if cfg.split == "column" else len(graph.ops) - 1
    strategy[where] = cfg
    with pytest.raises(ValueError, match=fix.replace("[", r"\[").replace("]", r"\]")):
        check_strategy(graph, tuple(strategy), world_size)


def test_a_batch_that_does_not_split_names_the_fix():
    graph = kit_graph("mlp", 30)
    with pytest.raises(ValueError, match="a batch that is a multiple of 4"):
        sim_of(graph, 4).run(data_parallel(graph, 4))


@pytest.mark.parametrize("topology", ["pairs", "bus"])
def test_delta_simulation_equals_the_full_one_after_random_changes(topology):
    graph, world_size = graph_of(LeNet(num_classes=12), (1, 8, 8), 32), 4
    sim = sim_of(graph, world_size, Network(LINK, topology))
    space = search_space(sim)
    rng = random.Random(1)
    strategy = expert_hybrid(graph, world_size)
    prev, reused = sim.run(strategy), 0
    for _ in range(40):
        i = rng.randrange(len(strategy))
        strategy = strategy[:i] + (rng.choice(space[i]),) + strategy[i + 1 :]
        delta = sim.delta(prev, strategy)
        full = sim.run(strategy)
        assert delta.order == full.order
        assert delta.start == full.start and delta.end == full.end
        for device, spans in full.timeline().items():  # a device runs one task at a time
            ends = sorted(spans)
            assert all(a[1] <= b[0] + 1e-15 for a, b in zip(ends, ends[1:], strict=False)), device
        reused += delta.resumed_at > 0
        prev = delta
    assert reused > 10  # the delta really replayed part of the old run, most of the time


def test_delta_of_an_unchanged_graph_replays_everything():
    graph = kit_graph("mlp", 16)
    sim = sim_of(graph, 2)
    full = sim.run(data_parallel(graph, 2))
    again = simulate_delta(full, dict(full.tasks))
    assert again.resumed_at == len(full.order) and again.end == full.end


def test_measured_costs_are_timed_once_and_cached_per_machine(tmp_path):
    graph = kit_graph("mlp", 8)
    path = tmp_path / "op_costs.json"
    costs = MeasuredCosts(path, repeats=2)
    cfg = ParallelConfig("sample", (0, 1))
    linear = graph.ops[1]
    fwd, bwd = costs(linear, cfg, graph.batch)
    assert fwd > 0 and bwd > 0 and costs.measured == 1
    again = MeasuredCosts(path, repeats=2)
    assert again(linear, cfg, graph.batch) == (fwd, bwd) and again.measured == 0
    assert costs.machine in path.read_text()
    # a different shard (half the neurons) is a different measurement
    costs(linear, ParallelConfig("column", (0, 1)), graph.batch)
    assert costs.measured == 2


def test_alexnet_weird_trick_prediction_is_computed_and_monotone():
    """A prediction (not the paper's numbers): speed-up of the hybrid and of pure DP, 1..8 GPUs."""
    link = LinkModel(alpha=1e-5, beta=1 / 6e9)  # PCIe peer-to-peer, about 6 GB/s
    speedups = {}
    for n in (1, 2, 4, 8):
        graph = build_graph("alexnet", (3, 224, 224), alexnet_layers(), 128 * n)
        sim = Simulator(graph, n, FlopsCosts(1.5e12), link)
        speedups[n] = [
            n * 1.0 / sim.run(s(graph, n)).step_time for s in (expert_hybrid, data_parallel)
        ]
    for k in (0, 1):
        curve = [speedups[n][k] / speedups[1][k] for n in (1, 2, 4, 8)]
        assert curve == sorted(curve) and curve[-1] > 1
