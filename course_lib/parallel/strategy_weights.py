"""Lecture 13: The weights a strategy trains, put back together, and one process's for comparison.

Every strategy of :mod:`course_lib.parallel.strategy_runs` is the same computation (source 003):
after the same updates on the same global batch, the pieces every rank holds (a whole replica,
a column or row shard of a dense layer, a pipeline stage) make one process's weights.
:func:`pieces` says what a rank holds, :func:`whole_weights` assembles them (and how far two
ranks' copies of one value differ), :func:`one_process_weights` is the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "OPTIMIZERS",
    "make_optimizer",
    "one_process_weights",
    "pieces",
    "problem",
    "whole_weights",
]

OPTIMIZERS = ("sgd", "adam")


def problem(model: str, batch: int, seed: int):
    """Return (graph, net, X, y): the model seeded with ``seed`` and its random global batch."""
    import torch

    from course_lib.training.models import build_model
    from course_lib.training.operator_graphs import kit_graph

    graph = kit_graph(model, batch)
    torch.manual_seed(seed)
    net = build_model(model)  # kit_graph(model) above: a chain the simulator knows
    X = torch.randn(batch, *graph.input_shape)
    y = torch.randint(0, net[-1].out_features, (batch,))
    return graph, net, X, y


def make_optimizer(kind: str, params, lr: float):
    """Return plain SGD or Adam over ``params`` at rate ``lr``."""
    import torch

    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; choose one of {OPTIMIZERS}")
    params = list(params)
    return torch.optim.SGD(params, lr) if kind == "sgd" else torch.optim.Adam(params, lr)


def one_process_weights(
    model: str, batch: int, steps: int, seed: int = 0, lr: float = 0.05, optimizer: str = "sgd"
) -> dict[str, np.ndarray]:
    """Return the weights one process reaches in ``1 + steps`` steps on ``run_strategy``'s batch."""
    from torch import nn

    _, net, X, y = problem(model, batch, seed)
    opt = make_optimizer(optimizer, net.parameters(), lr)
    for _ in range(steps + 1):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(X), y).backward()
        opt.step()
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def pieces(name: str, net, parts, rank: int, first_dense: int) -> list[tuple]:
    """Return what this rank holds as ``(name in net, dim, start, stop, values)`` (dim -1: whole)."""
    from course_lib.parallel.model_parallel.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
    )

    def whole(module, offset: int) -> list[tuple]:
        out = []
        for key, v in module.state_dict().items():
            index, rest = key.split(".", 1)
            out.append((f"{int(index) + offset}.{rest}", -1, 0, 0, v.detach().numpy().copy()))
        return out

    if name == "one worker":
        return whole(net, 0) if rank == 0 else []
    if name == "pipeline":
        return whole(parts, 0 if rank == 0 else first_dense)
    if name == "attribute":
        return whole(parts.convs, 0) + whole(parts.head, parts.flat)
    if name != "hybrid":
        return whole(net, 0)
    out = whole(parts.convs, 0)
    head_at = len(parts.convs)
    for j, layer in enumerate(parts.head):
        key = str(head_at + j)
        if isinstance(layer, ColumnParallelLinear):
            a, b = layer.out_bounds[rank]
            for what in ("weight", "bias"):
                out.append((f"{key}.{what}", 0, a, b, getattr(layer, what).detach().numpy().copy()))
        elif isinstance(layer, RowParallelLinear):
            a, b = layer.in_bounds[rank]
            out.append((f"{key}.weight", 1, a, b, layer.weight.detach().numpy().copy()))
            out.append((f"{key}.bias", -1, 0, 0, layer.bias.detach().numpy().copy()))
    return out


def whole_weights(model: str, runs: list[dict[str, Any]]) -> tuple[dict[str, np.ndarray], float]:
    """Return the model's weights put together from every rank's pieces, and the largest
    difference between two ranks' copies of one value (0.0: the replicas agree bit for bit)."""
    from course_lib.training.models import build_model

    shapes = {k: tuple(v.shape) for k, v in build_model(model).state_dict().items()}
    out = {k: np.full(s, np.nan, np.float32) for k, s in shapes.items()}
    worst = 0.0
    for run in runs:
        for key, dim, a, b, values in run.get("weights", []):
            index = (slice(None),) * dim + (slice(a, b),) if dim >= 0 else (slice(None),)
            target = out[key][index]
            held = ~np.isnan(target)
            if held.any():
                worst = max(worst, float(np.abs(target[held] - values[held]).max()))
            out[key][index] = values
    missing = [k for k, v in out.items() if np.isnan(v).any()]
    if missing:
        raise ValueError(f"no rank holds all of {missing}: were the runs made with lr > 0?")
    return out, worst
