"""Krizhevsky's hybrid and the CNN's tensor-parallel dense head on real engines (gloo, 2 and 4).

Reference: the same ``LeNet`` trained in one process on the whole batch. Tolerance: float32
throughout; the hybrid adds the same numbers in other orders (the convolutions' gradient as a
sum of per-rank shares round the ring, the dense layers' partial sums, the features' gradient
from every rank's neurons), so results differ by rounding only (~1e-7 relative per sum). Three
SGD steps with lr 0.1 barely amplify that: atol 1e-5 on every weight after the last step.

Bytes are compared exactly: every collective of the hybrid goes round the ring from
point-to-point messages, so the per-peer counters show the bytes sent; the sizes are chosen so
that every ring chunk is equal (batch and widths times the batch divisible by 2 and 4), where
each rank's bytes equal the formula, not only their mean.
"""

from __future__ import annotations

import pytest

from course_lib.parallel.model_parallel.hybrid import crossover_batch, hybrid_bytes, layer_sizes

ATOL = 1e-5


@pytest.fixture(scope="module")
def cluster(shared_engines):
    """The session's 4 pooled engines, with gloo ``comm`` (4 ranks) and ``comm2`` (ranks 0, 1)."""
    from course_lib.comm import setup_communicators

    cluster = shared_engines(4)
    setup_communicators(cluster, backend="gloo", timeout=90)  # the machine is shared
    cluster.run(_make_subgroups, timeout=60)
    return cluster


def _make_subgroups() -> None:
    from IPython import get_ipython

    ns = get_ipython().user_ns
    ns["comm4"], ns["comm2"] = ns["comm"], ns["comm"].subgroup([0, 1])


def _train_case(size: int, steps: int, batch: int) -> dict | None:
    """Train LeNet ``steps`` SGD steps: hybrid, tensor-parallel head, one process; return errors."""
    import copy

    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.parallel.model_parallel.hybrid import HybridCNN, hybrid_step, shard_batch
    from course_lib.parallel.model_parallel.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        TensorParallelMLP,
    )
    from course_lib.training.models import LeNet

    comm = get_ipython().user_ns[f"comm{size}"]
    if comm is None:
        return None
    torch.manual_seed(3)  # the same full model and data on every rank
    ref = LeNet()
    # TensorParallelMLP keeps the convolution modules it is given: give it a copy of them
    hybrid, head_tp = HybridCNN(ref, comm), TensorParallelMLP(copy.deepcopy(ref), comm)
    X, y = torch.randn(steps, batch, 1, 8, 8), torch.randint(0, 10, (steps, batch))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, hybrid, head_tp)]
    start = [p.detach().clone() for p in ref.parameters()]
    losses, parts = [], []
    for step in range(steps):
        for opt in opts:
            opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(X[step]), y[step])
        loss.backward()
        losses.append(loss.item())
        comm.stats.reset()
        report = hybrid_step(hybrid, *shard_batch(X[step], y[step], comm))
        parts.append(report.bytes)
        nn.functional.cross_entropy(head_tp(X[step]), y[step]).backward()
        for opt in opts:
            opt.step()
    errors = {"loss": abs(report.loss - losses[-1])}
    dense_ref = [m for m in ref if isinstance(m, nn.Linear)]
    for name, net, dense in (
        ("hybrid", hybrid, list(hybrid.head)),
        ("head tp", head_tp, list(head_tp)),
    ):
        convs = [m for m in (hybrid.convs if name == "hybrid" else net) if isinstance(m, nn.Conv2d)]
        ref_convs = [m for m in ref if isinstance(m, nn.Conv2d)]
        errors[f"{name} conv"] = max(
            (a.weight - b.weight).abs().max().item() for a, b in zip(convs, ref_convs, strict=True)
        )
        shards = [m for m in dense if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
        worst = 0.0
        for layer, full in zip(shards, dense_ref, strict=True):
            if isinstance(layer, ColumnParallelLinear):  # column-parallel: rows of W, slice of b
                a, b = layer.out_bounds[comm.rank]
                w_ref, b_ref = full.weight[a:b], full.bias[a:b]
            else:  # row-parallel: columns of W, the whole b
                a, b = layer.in_bounds[comm.rank]
                w_ref, b_ref = full.weight[:, a:b], full.bias
            worst = max(
                worst,
                (layer.weight - w_ref).abs().max().item(),
                (layer.bias - b_ref).abs().max().item(),
            )
        errors[f"{name} dense"] = worst
    moved = max((p - p0).abs().max().item() for p, p0 in zip(ref.parameters(), start, strict=True))
    return {"errors": errors, "weights moved": moved, "bytes": parts}


@pytest.mark.timeout(300)
def test_hybrid_and_tensor_parallel_head_equal_one_process_and_bytes_equal_formula(cluster):
    from course_lib.training.models import LeNet

    conv_params, widths = layer_sizes(LeNet())
    for size in (2, 4):
        results = [r for r in cluster.run(_train_case, size, 3, 16, timeout=180) if r]
        assert len(results) == size
        want = hybrid_bytes(16, size, conv_params, widths)
        for rank, res in enumerate(results):
            assert res["weights moved"] > 1e-3  # the model really trained
            for what, error in res["errors"].items():
                assert error < ATOL, (size, rank, what, error)
            for step_bytes in res["bytes"]:  # every step, every part, every rank: exact
                assert step_bytes == {k: int(v) for k, v in want.items()}, (size, rank)


def _bytes_case(batch: int) -> dict:
    """Return this rank's bytes of one hybrid step and of one pure data-parallel (ring) step."""
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.collectives.ring import ring_allreduce
    from course_lib.parallel.exchanges.base import flatten_grads
    from course_lib.parallel.model_parallel.hybrid import HybridCNN, hybrid_step, shard_batch
    from course_lib.training.models import LeNet

    comm = get_ipython().user_ns["comm4"]
    torch.manual_seed(0)
    net = LeNet()
    X, y = shard_batch(torch.randn(batch, 1, 8, 8), torch.randint(0, 10, (batch,)), comm)
    comm.stats.reset()
    hybrid = sum(hybrid_step(HybridCNN(net, comm), X, y).bytes.values())
    nn.functional.cross_entropy(net(X), y).backward()
    comm.stats.reset()
    ring_allreduce(comm, flatten_grads(list(net.parameters())).numpy())  # data parallelism's ring
    return {"hybrid": hybrid, "data parallel": comm.stats.bytes_sent}


@pytest.mark.timeout(300)
def test_crossover_batch_from_the_cost_model_matches_the_counters(cluster):
    from course_lib.parallel.model_parallel.hybrid import data_parallel_bytes, dense_params
    from course_lib.training.models import LeNet

    conv_params, widths = layer_sizes(LeNet())
    crossover = crossover_batch(4, conv_params, widths)
    assert 64 < crossover < 96, crossover  # LeNet on digits, 4 ranks: about 79 samples
    dp = data_parallel_bytes(conv_params + dense_params(widths), 4)
    for batch in (64, 96):  # one batch each side of the crossover
        results = cluster.run(_bytes_case, batch, timeout=120)
        mean = {k: sum(r[k] for r in results) / 4 for k in results[0]}
        assert mean["data parallel"] == dp
        assert mean["hybrid"] == sum(hybrid_bytes(batch, 4, conv_params, widths).values())
        assert (mean["hybrid"] < mean["data parallel"]) == (batch < crossover), (batch, mean)


def _bad_inputs() -> dict:
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.parallel.model_parallel.hybrid import HybridCNN, hybrid_step, shard_batch
    from course_lib.training.models import LeNet

    comm = get_ipython().user_ns["comm4"]
    messages = {}
    for name, make in (
        ("batch", lambda: shard_batch(torch.zeros(30, 1, 8, 8), torch.zeros(30), comm)),
        ("width", lambda: HybridCNN(LeNet(num_classes=3), comm)),
        ("no dense", lambda: HybridCNN(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), comm)),
        (
            "shards",
            lambda: hybrid_step(
                HybridCNN(LeNet(), comm),
                torch.zeros(4 + (comm.rank == 0), 1, 8, 8),
                torch.zeros(4 + (comm.rank == 0), dtype=torch.long),
            ),
        ),
    ):
        try:
            make()
            messages[name] = "no error"
        except ValueError as exc:
            messages[name] = str(exc)
    return messages


@pytest.mark.timeout(120)
def test_bad_input_names_the_fix(cluster):
    for messages in cluster.run(_bad_inputs, timeout=60):
        assert "batch of 30 samples does not split over 4 ranks" in messages["batch"]
        assert "multiple of 4 (e.g. 28 or 32)" in messages["batch"]
        assert "cannot split a column-parallel output of 3 over 4 ranks" in messages["width"]
        assert "at most 3 ranks" in messages["width"]
        assert "no nn.Flatten followed by nn.Linear" in messages["no dense"]
        assert "every rank needs an equal shard" in messages["shards"]
        assert "(5, 5), (4, 4)" in messages["shards"] and "shard_batch" in messages["shards"]


def features_grad_by_reduce_scatter(comm, grad_whole):
    return comm.reduce_scatter(grad_whole.contiguous()).reshape(-1, grad_whole.shape[1])


def features_grad_by_ring(comm, grad_whole):
    from course_lib.parallel.model_parallel.hybrid import scatter_batch_grad

    return scatter_batch_grad(comm, grad_whole)


def features_grad_by_allreduce(comm, grad_whole):
    b = len(grad_whole) // comm.world_size
    return comm.allreduce(grad_whole.contiguous())[comm.rank * b : (comm.rank + 1) * b]


def features_grad_without_the_sum(comm, grad_whole):
    b = len(grad_whole) // comm.world_size
    return grad_whole[comm.rank * b : (comm.rank + 1) * b]


@pytest.mark.timeout(300)
def test_lecture09_features_grad_check_passes_answers_and_fails_stub_and_wrong_ones(cluster):
    from course_lib.checks.lecture09 import check_features_grad, stub_features_grad

    verdict = check_features_grad(features_grad_by_reduce_scatter, cluster, verbose=False)
    assert verdict.passed, verdict
    verdict = check_features_grad(features_grad_by_ring, cluster, verbose=False)
    assert not verdict.passed and "calls course_lib" in verdict.detail, verdict  # the library's
    verdict = check_features_grad(stub_features_grad, cluster, verbose=False)
    assert not verdict.passed and "not implemented" in verdict.detail, verdict
    verdict = check_features_grad(features_grad_by_allreduce, cluster, verbose=False)
    assert not verdict.passed and "moves more than the answer needs (allreduce)" in verdict.detail
    verdict = check_features_grad(features_grad_without_the_sum, cluster, verbose=False)
    assert not verdict.passed and "differs from the sum over ranks" in verdict.detail, verdict
