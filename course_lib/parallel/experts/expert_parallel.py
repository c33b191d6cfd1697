"""Lecture 15: Expert parallelism: each rank holds E/N experts; tokens travel to them by all-to-all.

Every rank keeps the router (replicated, as in data parallelism) and its own tokens; it routes
them (:mod:`.gating`) into an (E, capacity, d) buffer whose rows for the experts of rank ``j``
form block ``j``. One all-to-all **dispatches** the blocks: rank ``j`` then holds, for each of its
experts, a capacity's worth of slots from every rank. Its experts run, and a second all-to-all
**combines**: each rank gets its own slots back and adds them up per token with the gates
(GShard, Lepikhin et al. 2020, §3.2). Backward is the same two all-to-alls the other way (an
all-to-all's gradient is the all-to-all of the gradient). Per layer and step each rank sends
$4\\frac{N-1}{N} E C d$ values: two all-to-alls forward, two backward (three when the
layer's input is data, whose gradient nobody needs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from course_lib.parallel.experts.layer import MoE, combine, dispatch

__all__ = ["AllToAll", "ExpertParallelMoE", "moe_step_bytes"]


def _builtin(comm: Any, x: torch.Tensor) -> torch.Tensor:
    return comm.all_to_all(x)


class AllToAll(torch.autograd.Function):
    """Equal-block all-to-all of the rows of ``x`` with autograd: backward is the same exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Any, exchange: Callable) -> torch.Tensor:  # noqa: D102
        ctx.comm, ctx.exchange = comm, exchange
        return exchange(comm, x.detach().contiguous()).clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[Any, ...]:  # noqa: D102
        # block (i, j) went from rank i to rank j; its gradient goes back from j to i
        return ctx.exchange(ctx.comm, grad.contiguous()).clone(), None, None


class ExpertParallelMoE(nn.Module):
    """This rank's share of an ``MoE``: the router, and experts ``rank*E/N .. (rank+1)*E/N - 1``.

    ``exchange(comm, x)`` is the all-to-all used (default the backend's ``comm.all_to_all``;
    e.g. ``course_lib.collectives.pairwise_all_to_all``). Every rank calls ``forward`` together.
    """

    def __init__(self, full: MoE, comm: Any, exchange: Callable | None = None) -> None:
        super().__init__()
        E, N = full.num_experts, comm.world_size
        if E % N:
            raise ValueError(f"{E} experts do not split over {N} ranks: choose E a multiple of N")
        self.comm, self.exchange = comm, exchange or _builtin
        self.num_experts, self.k, self.capacity_factor = E, full.k, full.capacity_factor
        self.local = E // N
        first = comm.rank * self.local
        self.router = _copy(full.router)
        self.experts = nn.ModuleList(_copy(full.experts[first + i]) for i in range(self.local))

    def route(self, x: torch.Tensor) -> Any:
        """Route this rank's tokens exactly as the one-process layer routes a group."""
        return MoE.route(self, x)  # type: ignore[arg-type]  # uses the same four attributes

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Return (output for this rank's tokens, its balancing loss, its routing)."""
        N, L, d = self.comm.world_size, self.local, x.shape[1]
        r = self.route(x)
        C = r.capacity
        buf = dispatch(x, r, self.num_experts)  # (E, C, d): block j = rank j's experts
        got = AllToAll.apply(buf.reshape(-1, d), self.comm, self.exchange)
        got = got.view(N, L, C, d)  # [source rank, local expert, slot]
        out = torch.stack([e(got[:, i].reshape(N * C, d)) for i, e in enumerate(self.experts)])
        out = out.view(L, N, C, d).transpose(0, 1).reshape(-1, d)  # back to [source, expert]
        back = AllToAll.apply(out.contiguous(), self.comm, self.exchange)
        return combine(back.view(self.num_experts, C, d), r), r.aux_loss, r


def _copy(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)


def moe_step_bytes(
    num_experts: int,
    cap: int,
    d_model: int,
    world_size: int,
    itemsize: int = 4,
    input_needs_grad: bool = True,
) -> float:
    """Return the bytes one rank sends per training step of one layer: all-to-alls of E*C*d.

    Four (dispatch and combine, forward and backward), or three for a layer fed straight by
    data: nothing needs the gradient of its input, so autograd skips the dispatch's backward.
    """
    calls = 4 if input_needs_grad else 3
    return calls * (world_size - 1) / world_size * num_experts * cap * d_model * itemsize
