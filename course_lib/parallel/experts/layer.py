"""Lecture 15: A mixture-of-experts layer in one process: a router, ``E`` expert MLPs, fixed buffers.

Each token is sent to ``k`` of ``E`` feed-forward experts (:mod:`.gating`), so the layer holds
``E`` times the MLP's weights while each token pays for ``k`` MLPs (Shazeer et al. 2017). The
tokens are copied into a buffer of shape (E, capacity, d), each expert runs on its row of the
buffer, and the outputs are weighted by the gates and added back per token: the dispatch and
combine that expert parallelism (:mod:`.expert_parallel`) turns into two all-to-alls. Tokens are
routed **per group** (a rank's tokens), each group with its own capacity, as GShard does, so
that the one-process layer and the expert-parallel one route, drop and combine the same tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.parallel.experts.gating import Routing, capacity, route

__all__ = ["Expert", "MoE", "combine", "dispatch"]


class Expert(nn.Module):
    """One feed-forward expert: d -> hidden -> d with a GELU, as the transformer's MLP."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d_model, d_hidden), nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def dispatch(x: torch.Tensor, r: Routing, num_experts: int) -> torch.Tensor:
    """Return the (E, capacity, d) buffer: each kept choice's token in its expert's slot, zeros elsewhere."""
    T, d = x.shape
    kept = r.slot >= 0
    token = torch.arange(T).unsqueeze(1).expand_as(r.slot)[kept]
    flat = r.expert[kept] * r.capacity + r.slot[kept]
    buf = x.new_zeros(num_experts * r.capacity, d).index_copy(0, flat, x[token])
    return buf.view(num_experts, r.capacity, d)


def combine(out: torch.Tensor, r: Routing) -> torch.Tensor:
    """Return each token's output: the gate-weighted sum of its kept choices' expert outputs."""
    E, C, d = out.shape
    kept = (r.slot >= 0).to(out.dtype)
    index = (r.expert * C + r.slot.clamp(min=0)).reshape(-1)
    picked = out.reshape(E * C, d)[index].view(*r.slot.shape, d)  # (T, k, d)
    return (picked * (r.gate * kept).unsqueeze(2)).sum(1)


class MoE(nn.Module):
    """A router and ``num_experts`` experts; ``forward(x, groups)`` routes each group on its own."""

    def __init__(
        self,
        d_model: int,
        d_hidden: int,
        num_experts: int,
        k: int = 1,
        capacity_factor: float = 1.0,
    ) -> None:
        super().__init__()
        capacity(1, num_experts, k, capacity_factor)  # validates the settings
        self.num_experts, self.k, self.capacity_factor = num_experts, k, capacity_factor
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model, d_hidden) for _ in range(num_experts))

    def route(self, x: torch.Tensor) -> Routing:
        """Route one group of tokens (T, d)."""
        cap = capacity(x.shape[0], self.num_experts, self.k, self.capacity_factor)
        return route(self.router(x), self.k, cap)

    def forward(
        self, x: torch.Tensor, groups: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor, list[Routing]]:
        """Return (output (T, d), mean balancing loss over groups, each group's routing)."""
        outs, routings = [], []
        for part in x.chunk(groups):
            r = self.route(part)
            buf = dispatch(part, r, self.num_experts)
            out = torch.stack([e(buf[i]) for i, e in enumerate(self.experts)])
            outs.append(combine(out, r))
            routings.append(r)
        aux = torch.stack([r.aux_loss for r in routings]).mean()
        return torch.cat(outs), aux, routings
