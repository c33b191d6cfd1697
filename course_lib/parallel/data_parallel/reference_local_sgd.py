"""Lectures 5-6: Local-SGD simulated in one process: P replicas stepped in lockstep, averaged by matrices.

The reference that ``local_sgd`` runs on engines must match: the same initial network (rank
0's, seeded with ``config.seed``), each replica fed exactly the batches rank ``r`` gets
(:class:`~course_lib.parallel.data_parallel.replica.GlobalBatchSampler`), each with its own optimiser, and
every ``period`` steps the stacked weights replaced by ``W @ X`` with the scheme's mixing
matrix (:mod:`course_lib.collectives.mixing`). With ``averaging="gossip"`` and ``period=1`` the
*gradients* are mixed instead (source 001's Algorithm 2), as the exchange does, with a presence
flag per tensor mixed beside them: a tensor that neither a replica nor its partners has a
gradient for keeps ``grad = None`` on that replica. Only float32
rounding separates the two (the engines sum in the backend's order): the tolerance of
:mod:`course_lib.parallel.data_parallel.reference` applies.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from course_lib.collectives.mixing import allreduce_matrix, gossip_distances, gossip_matrix
from course_lib.parallel.data_parallel.replica import GlobalBatchSampler
from course_lib.parallel.exchanges.base import trainable_parameters
from course_lib.training.loop import TrainConfig, compute_gradients, make_optimizer, seed_everything
from course_lib.training.models import build_model

__all__ = ["simulate_local_sgd"]


def _stack(tensors: list[list[torch.Tensor]]) -> np.ndarray:
    return np.stack([torch.cat([t.reshape(-1) for t in ts]).numpy() for ts in tensors])


def _unstack(mixed: np.ndarray, tensors: list[list[torch.Tensor]]) -> None:
    for row, ts in zip(mixed, tensors, strict=True):
        offset = 0
        for t in ts:
            t.copy_(torch.from_numpy(row[offset : offset + t.numel()]).view_as(t))
            offset += t.numel()


def _mix(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Return ``W @ X`` in float32 (allreduce as a float32 sum divided by P, like the engines)."""
    if np.allclose(w, w[0, 0]):  # J: a sum then a division, as comm.allreduce then /= P
        return np.broadcast_to(x.sum(axis=0) / x.shape[0], x.shape).astype(np.float32)
    return (w @ x.astype(np.float64)).astype(np.float32)


def _mix_gradients(w: np.ndarray, params: list[list[nn.Parameter]]) -> None:
    """Replace every replica's gradients by ``W @ G``; keep None where the mixed flag is 0."""
    grads = [[p.grad if p.grad is not None else torch.zeros_like(p) for p in ps] for ps in params]
    flags = np.array([[float(p.grad is not None) for p in ps] for ps in params], np.float32)
    _unstack(_mix(w, _stack(grads)), grads)
    present = _mix(w, flags)
    for ps, gs, row in zip(params, grads, present, strict=True):
        for p, g, flag in zip(ps, gs, row, strict=True):
            p.grad = g if flag != 0 else None


def simulate_local_sgd(
    model: Any,
    dataset: Any,
    config: TrainConfig,
    world_size: int,
    period: int = 1,
    averaging: str = "allreduce",
    order: str = "step_then_average",
) -> list[dict[str, np.ndarray]]:
    """Run Local-SGD(``period``) on ``world_size`` replicas here; return each replica's weights.

    ``averaging``: ``"allreduce"`` or ``"gossip"`` (rotating partner); ``order``:
    ``"step_then_average"`` or ``"average_then_step"`` (see :mod:`course_lib.parallel.exchanges.local_sgd`).
    """
    if averaging not in ("allreduce", "gossip"):
        raise ValueError(f"the simulation covers 'allreduce' and 'gossip', not {averaging!r}")
    seed_everything(config.seed)  # rank 0 seeds with seed + 0 before building its replica
    if isinstance(model, nn.Module):
        raise TypeError("pass a model name or a function building the network, not an instance")
    net = build_model(model) if isinstance(model, str) else model()
    data = dataset if isinstance(dataset, Dataset) else dataset()
    replicas = [copy.deepcopy(net) for _ in range(world_size)]
    local = replace(config, batch_size=config.batch_size // world_size)
    optimizers = [make_optimizer(r, local) for r in replicas]
    samplers = [
        GlobalBatchSampler(len(data), r, world_size, config.batch_size, seed=config.seed)
        for r in range(world_size)
    ]
    params = [trainable_parameters(r) for r in replicas]
    loss_fn = nn.CrossEntropyLoss(ignore_index=255)
    gradient_gossip = averaging == "gossip" and period == 1
    total = samplers[0].steps * config.num_epochs
    n_sync = total if gradient_gossip else total // period
    matrices = (
        [gossip_matrix(world_size, s) for s in gossip_distances(world_size, n_sync)]
        if averaging == "gossip"
        else [allreduce_matrix(world_size)] * n_sync
    )
    step = 0
    for epoch in range(config.num_epochs):
        loaders = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            loaders.append(DataLoader(data, batch_size=local.batch_size, sampler=sampler))
        for batches in zip(*loaders, strict=True):
            for r, (X, y) in enumerate(batches):
                replicas[r].train()
                compute_gradients(replicas[r], X, y, loss_fn)
            sync = (step + 1) % period == 0
            with torch.no_grad():
                if gradient_gossip and world_size > 1:
                    _mix_gradients(matrices[step], params)
                elif sync and order == "average_then_step":
                    _unstack(_mix(matrices[step // period], _stack(params)), params)
            for opt in optimizers:
                opt.step()
            if sync and order == "step_then_average" and not gradient_gossip:
                with torch.no_grad():
                    _unstack(_mix(matrices[step // period], _stack(params)), params)
            step += 1
    return [{k: p.detach().numpy().copy() for k, p in r.named_parameters()} for r in replicas]
