"""Tensor (model) parallel layers on real engines: gloo communicators over 2, 3 and 4 local
engines (sub-communicators of one 4-engine world), compared with a single ``nn.Linear``.

Tolerance: float32 everywhere. A row-parallel layer adds its partial sums in a different order
than one matmul does, so outputs and gradients differ from the single layer by rounding only
(relative ~1e-7 per sum); we allow atol 1e-5. Training k steps feeds those rounding errors back
through SGD, which barely amplifies them over 5 small steps: atol 1e-5 on the final weights too.
"""

from __future__ import annotations

import pytest

from course_lib.parallel.model_parallel.tensor_parallel import shard_bounds

SIZES = (2, 3, 4)
ATOL = 1e-5


@pytest.fixture(scope="module")
def cluster(shared_engines):
    """The session's 4 pooled engines, with gloo ``comm`` and ``comm2..comm4`` for this module."""
    from course_lib.comm import setup_communicators

    cluster = shared_engines(4)
    cluster.run(_import_torch, timeout=180)
    setup_communicators(cluster, backend="gloo", timeout=20)
    cluster.run(_make_subgroups, timeout=60)
    return cluster


def _import_torch() -> None:
    import torch  # noqa: F401


def _make_subgroups() -> None:
    from IPython import get_ipython

    ns = get_ipython().user_ns
    for size in SIZES:  # every rank calls subgroup, ranks outside get None
        ns[f"comm{size}"] = ns["comm"].subgroup(list(range(size)))


def _layers_case(size: int) -> dict | None:
    """Column, row and column->row pair vs full layers on ``comm{size}``; return max errors."""
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.parallel.model_parallel.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
    )

    comm = get_ipython().user_ns[f"comm{size}"]
    if comm is None:
        return None
    torch.manual_seed(0)  # the same full layers and data on every rank
    lin1, lin2 = nn.Linear(7, 10), nn.Linear(10, 5)  # 10 and 7 split unevenly over 3 and 4
    X, G1, G2 = torch.randn(6, 7), torch.randn(6, 10), torch.randn(6, 5)
    errors: dict = {}

    def compare(name, make, ref_net, G):
        X_ref, X_tp = X.clone().requires_grad_(), X.clone().requires_grad_()
        y_ref = ref_net(X_ref)
        (y_ref * G).sum().backward()
        net = make()
        comm.stats.reset()
        y_tp = net(X_tp)
        (y_tp * G).sum().backward()
        errors[name] = {
            "output": (y_tp - y_ref).abs().max().item(),
            "input grad": (X_tp.grad - X_ref.grad).abs().max().item(),
            "collectives": {k: v.calls for k, v in comm.stats.collectives.items()},
        }
        return net

    col = compare("column", lambda: ColumnParallelLinear.from_linear(lin1, comm), lin1, G1)
    a, b = col.out_bounds[comm.rank]
    errors["column"]["weight grad"] = (col.weight.grad - lin1.weight.grad[a:b]).abs().max().item()
    errors["column"]["bias grad"] = (col.bias.grad - lin1.bias.grad[a:b]).abs().max().item()
    lin1.zero_grad()
    row = compare("row", lambda: RowParallelLinear.from_linear(lin1, comm), lin1, G1)
    a, b = row.in_bounds[comm.rank]
    errors["row"]["weight grad"] = (row.weight.grad - lin1.weight.grad[:, a:b]).abs().max().item()
    errors["row"]["bias grad"] = (row.bias.grad - lin1.bias.grad).abs().max().item()
    lin1.zero_grad()

    def pair():
        return nn.Sequential(
            ColumnParallelLinear.from_linear(lin1, comm, gather_output=False),
            nn.ReLU(),
            RowParallelLinear.from_linear(lin2, comm, input_is_parallel=True),
        )

    net = compare("pair", pair, nn.Sequential(lin1, nn.ReLU(), lin2), G2)
    a, b = net[0].out_bounds[comm.rank]
    errors["pair"]["weight grad"] = max(
        (net[0].weight.grad - lin1.weight.grad[a:b]).abs().max().item(),
        (net[2].weight.grad - lin2.weight.grad[:, a:b]).abs().max().item(),
    )
    errors["pair"]["bias grad"] = (net[2].bias.grad - lin2.bias.grad).abs().max().item()
    return errors


def _train_case(size: int, steps: int) -> dict | None:
    """Train MLP(64, (30,), 10) ``steps`` SGD steps tensor-parallel and in one process."""
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.parallel.model_parallel.tensor_parallel import TensorParallelMLP
    from course_lib.training.models import MLP

    comm = get_ipython().user_ns[f"comm{size}"]
    if comm is None:
        return None
    torch.manual_seed(1)
    ref = MLP(64, (30,), 10)  # 30 hidden neurons: 8, 8, 7, 7 on four ranks
    tp = TensorParallelMLP(ref, comm)
    X, y = torch.randn(steps, 16, 64), torch.randint(0, 10, (steps, 16))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.2)
    opt_tp = torch.optim.SGD(tp.parameters(), lr=0.2)
    losses = []
    for step in range(steps):
        for net, opt in ((ref, opt_ref), (tp, opt_tp)):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(X[step]), y[step])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    a, b = tp[1].out_bounds[comm.rank]
    return {
        "w1": (tp[1].weight - ref[1].weight[a:b]).abs().max().item(),
        "b1": (tp[1].bias - ref[1].bias[a:b]).abs().max().item(),
        "w2": (tp[3].weight - ref[3].weight[:, a:b]).abs().max().item(),
        "b2": (tp[3].bias - ref[3].bias).abs().max().item(),
        "loss moved": abs(losses[0] - losses[-1]),
    }


def _bad_width() -> str:
    from IPython import get_ipython

    from course_lib.parallel.model_parallel.tensor_parallel import ColumnParallelLinear

    try:
        ColumnParallelLinear(8, 3, get_ipython().user_ns["comm"])
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(300)
def test_column_row_and_pair_equal_one_linear(cluster):
    for size in SIZES:
        results = [r for r in cluster.run(_layers_case, size, timeout=120) if r is not None]
        assert len(results) == size
        for rank, errors in enumerate(results):
            for layer, errs in errors.items():
                for what, value in errs.items():
                    if what != "collectives":
                        assert value < ATOL, (size, rank, layer, what, value)
            # Megatron: the pair costs one allreduce forward (g) and one backward (f, dL/dX)
            assert errors["pair"]["collectives"] == {"allreduce": 2}, errors["pair"]
            assert errors["column"]["collectives"] == {"allreduce": 1, "allgather": 1}
            assert errors["row"]["collectives"] == {"allreduce": 1, "allgather": 1}


@pytest.mark.timeout(300)
def test_mlp_trained_tensor_parallel_equals_one_process(cluster):
    for size in (4,):  # 30 hidden neurons: 8, 8, 7, 7
        results = [r for r in cluster.run(_train_case, size, 5, timeout=120) if r is not None]
        assert len(results) == size
        for rank, errs in enumerate(results):
            assert errs.pop("loss moved") > 1e-3  # the model really trained
            assert max(errs.values()) < ATOL, (size, rank, errs)


@pytest.mark.timeout(120)
def test_width_that_cannot_be_split_names_the_fix(cluster):
    for message in cluster.run(_bad_width, timeout=60):
        assert "cannot split a column-parallel output of 3 over 4 ranks" in message
        assert "at most 3 ranks" in message
    with pytest.raises(ValueError, match="at most 2 ranks"):
        shard_bounds(2, 3)
    assert [b - a for a, b in shard_bounds(10, 4)] == [3, 3, 2, 2]


def column_by_allgather(comm, X, W_shard):
    import torch

    return torch.cat(list(comm.allgather((X @ W_shard.T).contiguous())), dim=-1)


def row_by_allreduce(comm, X_shard, W_shard):
    return comm.allreduce((X_shard @ W_shard.T).contiguous())


def row_without_reduction(comm, X_shard, W_shard):
    return X_shard @ W_shard.T


def column_by_allreducing_everything(comm, X, W_shard):
    import torch

    k = W_shard.shape[0]
    full = torch.zeros(X.shape[0], k * comm.world_size)
    full[:, comm.rank * k : (comm.rank + 1) * k] = X @ W_shard.T
    return comm.allreduce(full)


@pytest.mark.timeout(300)
def test_lecture09_checks_pass_answers_and_fail_stubs_and_wrong_ones(cluster):
    from course_lib.checks.lecture09 import (
        check_column_parallel,
        check_row_parallel,
        stub_column_parallel,
        stub_row_parallel,
    )

    assert check_column_parallel(column_by_allgather, cluster, verbose=False).passed
    assert check_row_parallel(row_by_allreduce, cluster, verbose=False).passed
    for check, stub in (
        (check_column_parallel, stub_column_parallel),
        (check_row_parallel, stub_row_parallel),
    ):
        verdict = check(stub, cluster, verbose=False)
        assert not verdict.passed and "not implemented" in verdict.detail, verdict
    verdict = check_row_parallel(row_without_reduction, cluster, verbose=False)
    assert not verdict.passed and "differs from X @ W.T" in verdict.detail, verdict
    verdict = check_column_parallel(column_by_allreducing_everything, cluster, verbose=False)
    assert not verdict.passed and "the split needs only" in verdict.detail, verdict
