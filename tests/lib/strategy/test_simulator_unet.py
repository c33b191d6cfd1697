"""The U-Net's operator graph (a chain with skip connections) in lecture 13's simulator.

References: the model's own parameter count, PyTorch's FLOP counter on a real forward pass
(``torch.utils.flop_counter``: convolutions and transposed convolutions, 2 FLOPs a
multiply-add), the ring's byte formula for data parallelism, byte counts worked out by hand
for a skip connection, and the full simulation as the reference of the delta one.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.configs import ParallelConfig, data_parallel
from course_lib.cost_model.op_costs import FlopsCosts
from course_lib.cost_model.operators import build_graph
from course_lib.cost_model.search import mcmc, search_space
from course_lib.cost_model.simulator import Simulator
from course_lib.parallel.model_parallel.hybrid import data_parallel_bytes
from course_lib.training.models import UNet, param_count
from course_lib.training.operator_graphs import graph_of, kit_graph

LINK = LinkModel(alpha=1e-5, beta=1e-8)
COSTS = FlopsCosts(1e9)


@pytest.mark.parametrize("width, depth", [(8, 3), (16, 4), (4, 1)])
def test_the_graph_holds_the_unets_parameters_and_flops(width, depth):
    net, batch = UNet(base_width=width, depth=depth), 2
    graph = graph_of(net, (3, 64, 64), batch)
    assert graph.params == param_count(net)
    with FlopCounterMode(display=False) as counter:
        net(torch.randn(batch, 3, 64, 64))
    weighted = sum(op.flops for op in graph.ops if op.kind in ("conv2d", "upconv"))
    assert weighted * batch == counter.get_total_flops()
    assert graph.ops[-1].in_shape == (6, 64, 64)  # per-pixel logits into the loss
    assert sum(op.kind == "concat" for op in graph.ops) == depth  # one skip per level


def test_a_concat_must_join_maps_of_one_size():
    with pytest.raises(ValueError, match="sizes must match"):
        build_graph("bad", (3, 8, 8), [("conv2d", 4, 3, 1, 1), ("maxpool", 2, 2), ("concat", 0)], 1)


def test_data_parallel_sends_the_rings_bytes_and_one_worker_the_sum_of_costs():
    graph = kit_graph("unet", 8)
    sim = Simulator(graph, 2, COSTS, LINK)
    sent = sim.run(data_parallel(graph, 2)).bytes_sent()
    assert sent == {w: pytest.approx(data_parallel_bytes(graph.params, 2)) for w in (0, 1)}
    one = Simulator(graph, 1, COSTS, LINK).run(data_parallel(graph, 1))
    assert one.step_time == pytest.approx(3 * sum(op.flops for op in graph.ops) * 8 / 1e9)


def test_a_skip_connection_carries_its_own_channels_both_ways():
    # Everything on worker 0 but the last concat, split by channels over workers 0 and 1: the
    # skip's 8 channels come first (worker 0's half), the upsampled 8 (worker 1's half) second.
    graph, batch = kit_graph("unet", 4), 4
    c = max(i for i, op in enumerate(graph.ops) if op.kind == "concat")
    skip, up = graph.producers(c)
    strategy = [ParallelConfig("replicate", (0,)) for _ in graph.ops]
    strategy[c] = ParallelConfig("column", (0, 1))
    run = Simulator(graph, 2, COSTS, LINK).run(tuple(strategy))
    half = 4 * batch * 8 * 64 * 64  # float32 bytes of 8 channels of 64 x 64
    assert run.tasks[f"{c:03d}xf:0>1"].nbytes == half  # the upsampled channels only
    assert not [t for t in run.tasks if t.startswith(f"{c:03d}k{skip:03d}xf")]  # skip: local
    assert run.tasks[f"{c:03d}xb:1>0"].nbytes == half  # their gradient goes back
    # the skip's producer waits for gradients from both its consumers (the pool and the concat)
    consumers = [i for i in range(len(graph.ops)) if skip in graph.producers(i)]
    assert consumers == [skip + 1, c]
    assert {f"{skip + 1:03d}B0", f"{c:03d}B0"} <= set(run.tasks[f"{skip:03d}B0"].preds)


def test_per_pixel_labels_travel_to_the_loss():
    graph, batch = kit_graph("unet", 4), 4
    strategy = tuple(ParallelConfig("replicate", (0,)) for _ in graph.ops)
    run = Simulator(graph, 2, COSTS, LINK).run(strategy)
    loss = len(graph.ops) - 1
    assert run.tasks[f"{loss:03d}l:1>0"].nbytes == 8 * (batch // 2) * 64 * 64  # int64 a pixel


def test_delta_equals_full_and_the_search_runs_on_the_unet():
    graph = kit_graph("unet", 8)
    sim = Simulator(graph, 2, COSTS, LINK)
    space = search_space(sim)
    rng, strategy = random.Random(3), data_parallel(graph, 2)
    prev = sim.run(strategy)
    for _ in range(25):
        i = rng.randrange(len(strategy))
        strategy = strategy[:i] + (rng.choice(space[i]),) + strategy[i + 1 :]
        delta, full = sim.delta(prev, strategy), sim.run(strategy)
        assert delta.order == full.order and delta.end == full.end
        for device, spans in full.timeline().items():  # a device runs one task at a time
            ends = sorted(spans)
            assert all(a[1] <= b[0] + 1e-15 for a, b in zip(ends, ends[1:], strict=False)), device
        prev = delta
    found = mcmc(sim, data_parallel(graph, 2), iterations=200, seed=0)
    assert found.best_time <= found.start_time and found.iterations == 200
