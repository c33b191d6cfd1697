"""Lecture 11: The bridge to PyTorch's sharding: ZeroRedundancyOptimizer (stage 1) and FSDP2 (stage 3) on the engines.

Each function runs on every engine of a cluster whose gloo communicators exist (after a
``train_data_parallel`` run or ``setup_communicators``): it uses torch.distributed's default
process group directly (so the kit's emulated link does not slow it), trains the model as the
kit's data-parallel runs do (same seed, same global batches split the same way over the ranks)
and returns the weights and the bytes of optimiser state this rank holds, to be set beside the
kit's ``zero1`` and ``zero3``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib.parallel.data_parallel.replica import GlobalBatchSampler
from course_lib.training.loop import TrainConfig, fit, seed_everything

__all__ = ["train_torch_sharded"]


def _average(net: nn.Module) -> None:
    """Average the gradients over the ranks (DDP's job, before ZeroRedundancyOptimizer's step)."""
    for p in net.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def _local_bytes(tensors: list[torch.Tensor]) -> int:
    """Return the bytes this rank holds of ``tensors`` (a DTensor's local shard only)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def train_torch_sharded(
    kind: str,
    make_model: Any,
    make_dataset: Any,
    config: TrainConfig,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """Train with PyTorch's ``kind``: ``"zero_redundancy"`` (stage 1) or ``"fsdp2"`` (stage 3).

    Runs on every engine at once; returns this rank's ``weights`` (whole, as NumPy arrays),
    ``optimizer_bytes`` and ``param_bytes`` (what this rank holds of each) and ``train_loss``
    (the mean over this rank's batches of the last epoch). ``param_dtype``, ``reduce_dtype``: FSDP2's ``MixedPrecisionPolicy``
    (None: float32), to set beside ``Zero3(compute_dtype=..., reduce_dtype=...)``.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "no process group on this engine: run train_data_parallel (gloo) or "
            "setup_communicators(cluster, backend='gloo') first"
        )
    rank, n = dist.get_rank(), dist.get_world_size()
    seed_everything(config.seed)
    net, data = make_model(), make_dataset()
    sampler = GlobalBatchSampler(len(data), rank, n, config.batch_size, seed=config.seed)
    local = replace(config, batch_size=config.batch_size // n)
    if (param_dtype or reduce_dtype) and kind != "fsdp2":
        raise ValueError("param_dtype and reduce_dtype are FSDP2's: use kind='fsdp2'")
    if kind == "zero_redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(
            net.parameters(), optimizer_class=torch.optim.Adam, lr=config.lr
        )
        history = fit(
            net, data, local, sampler=sampler, grad_hook=_average, optimizer=opt, progress=False
        )
        state = [t for s in opt.optim.state.values() for t in s.values() if t.dim()]
        weights = {k: p.detach().numpy().copy() for k, p in net.named_parameters()}
        param_bytes = _local_bytes(list(net.parameters()))
    elif kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (n,))
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        for module in net.modules():
            if module is not net and any(True for _ in module.parameters(recurse=False)):
                fully_shard(module, mesh=mesh, mp_policy=policy)  # one unit per layer (zero3's)
        fully_shard(net, mesh=mesh, mp_policy=policy)
        opt = torch.optim.Adam(net.parameters(), lr=config.lr)
        history = fit(net, data, local, sampler=sampler, optimizer=opt, progress=False)
        state = [t for s in opt.state.values() for t in s.values() if t.dim()]
        param_bytes = _local_bytes(list(net.parameters()))
        weights = {k: p.full_tensor().detach().numpy().copy() for k, p in net.named_parameters()}
    else:
        raise ValueError(f"kind={kind!r}: choose 'zero_redundancy' or 'fsdp2'")
    return {
        "rank": rank,
        "weights": weights,
        "optimizer_bytes": _local_bytes(state),
        "param_bytes": param_bytes,
        "train_loss": history.last.get("train_loss"),
    }
