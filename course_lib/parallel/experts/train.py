"""Lecture 15: Train a mixture of experts expert-parallel on engines, and the same one in one process.

Each rank holds ``tokens`` tokens of a regression task (a fixed random teacher) and minimises
its mean squared error plus ``aux_weight`` times its balancing loss. The global loss is the mean
over ranks, so gradients are averaged: the router is replicated, its gradient allreduced and
divided by N (data parallelism); an expert's gradient arrives already summed over every rank's
tokens through the combine's backward all-to-all, so it is only divided by N. The one-process
reference routes the same N groups with the same capacities and takes the mean of their losses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.parallel.experts.expert_parallel import ExpertParallelMoE
from course_lib.parallel.experts.layer import MoE

__all__ = [
    "MoEConfig",
    "moe_data",
    "train_moe_expert_parallel",
    "train_moe_one_process",
    "train_skewed_router",
]


@dataclass(frozen=True)
class MoEConfig:
    """A small MoE task: sizes, routing, tokens per rank, the balancing loss's weight, Adam's lr."""

    d_model: int = 16
    d_hidden: int = 32
    num_experts: int = 4
    k: int = 2
    capacity_factor: float = 1.0
    tokens: int = 24
    aux_weight: float = 0.01
    lr: float = 1e-2
    seed: int = 0

    def build(self) -> MoE:
        """Return the MoE every run starts from (the same weights for a given seed)."""
        torch.manual_seed(self.seed)
        return MoE(self.d_model, self.d_hidden, self.num_experts, self.k, self.capacity_factor)


def moe_data(cfg: MoEConfig, world_size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return step ``step``'s tokens and targets for all ranks, (N*tokens, d) each, rank 0's first."""
    g = torch.Generator().manual_seed(1000 * cfg.seed + step)
    X = torch.randn(world_size * cfg.tokens, cfg.d_model, generator=g)
    teacher = torch.randn(cfg.d_model, cfg.d_model, generator=torch.Generator().manual_seed(7))
    return X, torch.tanh(X @ teacher)


def _loss(y: torch.Tensor, Y: torch.Tensor, aux: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    return torch.nn.functional.mse_loss(y, Y) + cfg.aux_weight * aux


def train_moe_one_process(cfg: MoEConfig, world_size: int, steps: int) -> dict[str, Any]:
    """Train the MoE in one process on every rank's tokens, each rank's as a group; return weights and counts."""
    net = cfg.build()
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    dropped, losses = [], []
    for step in range(steps):
        X, Y = moe_data(cfg, world_size, step)
        opt.zero_grad()
        y, _, routings = net(X, groups=world_size)
        parts = zip(y.chunk(world_size), Y.chunk(world_size), routings, strict=True)
        loss = torch.stack([_loss(a, b, r.aux_loss, cfg) for a, b, r in parts]).mean()
        loss.backward()
        opt.step()
        dropped.append([r.dropped for r in routings])
        losses.append(float(loss.detach()))
    weights = {n: p.detach().numpy().copy() for n, p in net.named_parameters()}
    return {"weights": weights, "dropped": dropped, "losses": losses}


def train_moe_expert_parallel(
    comm: Any,
    cfg: MoEConfig,
    steps: int,
    exchange: Callable | None = None,
    dp_comm: Any = None,
) -> dict[str, Any]:
    """Train this rank's share on its tokens (every rank calls it); return its weights by global name.

    ``comm`` holds the experts (expert parallelism). With ``dp_comm`` (a data axis of a grid,
    :class:`course_lib.parallel.grid.ProcessGrid`) each line of ``comm`` is one replica of the
    whole layer, fed its own tokens: rank ``(d, e)`` of the grid is group ``d * E_ranks + e`` of
    the one-process reference, and every gradient is also summed along the data axis.
    """
    D, d = (dp_comm.world_size, dp_comm.rank) if dp_comm is not None else (1, 0)
    N, r = comm.world_size * D, d * comm.world_size + comm.rank
    net = ExpertParallelMoE(cfg.build(), comm, exchange)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    dropped, sent = [], []
    for step in range(steps):
        X, Y = moe_data(cfg, N, step)
        mine = slice(r * cfg.tokens, (r + 1) * cfg.tokens)
        opt.zero_grad()
        comm.stats.reset()
        y, aux, routing = net(X[mine])
        _loss(y, Y[mine], aux, cfg).backward()
        sent.append(_bytes_sent(comm))
        comm.allreduce(net.router.weight.grad)  # replicated: the mean of every rank's gradient
        for p in net.parameters():
            if dp_comm is not None:  # replicas of the layer: add what the other replicas saw
                dp_comm.allreduce(p.grad)
            p.grad /= N  # experts' gradients came summed over the ranks by the all-to-all
        opt.step()
        dropped.append(routing.dropped)
    first = comm.rank * net.local
    weights = {"router.weight": net.router.weight.detach().numpy().copy()}
    for i, e in enumerate(net.experts):
        for n, p in e.named_parameters():
            weights[f"experts.{first + i}.{n}"] = p.detach().numpy().copy()
    return {"weights": weights, "dropped": dropped, "bytes_sent": sent, "rank": r, "group": r}


def _bytes_sent(comm: Any) -> int:
    """Bytes this rank sent in the step so far: point-to-point plus the built-in all-to-all's."""
    a2a = comm.stats.collectives.get("all_to_all")
    return int(comm.stats.bytes_sent + (a2a.bytes if a2a else 0))


def train_skewed_router(cfg: MoEConfig, steps: int, skew: float = 0.5) -> dict[str, Any]:
    """Train one group from a router that favours expert 0; return where a fresh batch's tokens go.

    The router starts with expert 0's row pushed towards the (shifted) inputs, so most tokens
    prefer it: without the balancing loss the router learns to keep them there and the full
    expert drops them; ``cfg.aux_weight`` > 0 spreads them (Switch Transformer, §2.2).
    """
    net = cfg.build()
    with torch.no_grad():
        g = torch.Generator().manual_seed(cfg.seed + 1)
        net.router.weight[0] += skew * torch.randn(cfg.d_model, generator=g).abs()
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    for step in range(steps + 1):
        X, Y = moe_data(cfg, 1, step if step < steps else 10**6)
        X = X + 0.5  # inputs off-centre, so the skewed row scores high on most tokens
        if step == steps:
            break
        opt.zero_grad()
        y, aux, _ = net(X)
        _loss(y, Y, aux, cfg).backward()
        opt.step()
    with torch.no_grad():
        y, aux, (routing,) = net(X)
    return {
        "wanted": routing.wanted.tolist(),
        "dropped": routing.dropped,
        "aux_loss": float(aux),
        "mse": float(torch.nn.functional.mse_loss(y, Y)),
    }
