"""Lecture 15: PyTorch's DeviceMesh and DTensor tensor parallelism beside the kit's Megatron MLP.

``init_device_mesh("cpu", (N,))`` is a one-axis grid over the gloo world (the kit's
:class:`~course_lib.parallel.grid.ProcessGrid` with one axis); ``parallelize_module`` with
``ColwiseParallel`` on the MLP's first layer and ``RowwiseParallel`` on its second shards the
weights into DTensors exactly as lecture 9's :class:`ColumnParallelLinear` /
:class:`RowParallelLinear` do (Shoeybi et al. 2019): one allreduce forward, one backward.
:func:`compare_mlp` runs both from the same full MLP on every rank and returns how far apart
their outputs, input gradients and weight-gradient shards are. The kit splits the ``d_hidden``
neurons with ``shard_bounds`` (the first ranks one more); DTensor as ``torch.chunk`` does, so
``d_hidden`` is taken divisible by N, where the two layouts agree.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["compare_mlp"]


def compare_mlp(
    comm: Any, d_model: int = 8, d_hidden: int = 16, batch: int = 5
) -> dict[str, float]:
    """Run the MLP through DTensor's plans and through the kit's layers; return the largest differences.

    Every rank of the gloo world calls it (the kit's communicator must span the default group).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from course_lib.parallel.model_parallel.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
    )

    if d_hidden % comm.world_size:
        raise ValueError(
            f"d_hidden={d_hidden} must divide by {comm.world_size} ranks (see module docstring)"
        )
    torch.manual_seed(0)  # the same full MLP and input on every rank
    full = nn.Sequential(nn.Linear(d_model, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_model))
    X = torch.randn(batch, d_model)
    mesh = init_device_mesh("cpu", (comm.world_size,), mesh_dim_names=("tp",))
    dt = parallelize_module(_copy(full), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    kit = nn.Sequential(
        ColumnParallelLinear.from_linear(full[0], comm, gather_output=False),
        nn.GELU(),
        RowParallelLinear.from_linear(full[2], comm, input_is_parallel=True),
    )
    out = {}
    X_dt, X_kit = X.clone().requires_grad_(), X.clone().requires_grad_()
    y_dt, y_kit = dt(X_dt), kit(X_kit)
    y_dt = y_dt.full_tensor() if isinstance(y_dt, DTensor) else y_dt
    (y_dt**2).sum().backward()
    (y_kit**2).sum().backward()
    out["output"] = float((y_dt - y_kit).detach().abs().max())
    out["input grad"] = float((X_dt.grad - X_kit.grad).abs().max())
    for i, name in ((0, "column weight grad"), (2, "row weight grad")):
        local = dt[i].weight.grad.to_local()  # this rank's shard, as DTensor placed it
        out[name] = float((local - kit[i].weight.grad).abs().max())
    out["shard shapes equal"] = float(
        all(dt[i].weight.to_local().shape == kit[i].weight.shape for i in (0, 2))
    )
    return out


def _copy(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)
