"""Lecture 15: Top-k gating with a capacity: which expert each token goes to, in which slot, or dropped.

The router scores every token against every expert; a token goes to its ``k`` best (Switch
Transformer, Fedus et al. 2021: ``k = 1``, the gate is the expert's probability; GShard,
Lepikhin et al. 2020: ``k = 2``, the two probabilities renormalised to sum to 1). Each expert
takes at most ``capacity`` tokens from a group, so that every buffer has a fixed shape and the
all-to-all a fixed size: capacity $= \\lceil f \\cdot k \\cdot T / E \\rceil$ for ``T`` tokens, ``E``
experts and capacity factor ``f``. Slots are handed out in order: every token's first choice
before any second choice (GShard, Algorithm 2), and within a choice in token order; a choice
that finds its expert full is **dropped** (the token passes by the residual connection only).
The load-balancing loss (Switch, eq. 4) $E \\sum_e f_e P_e$, with $f_e$ the share of tokens whose
first choice is ``e`` and $P_e$ the mean router probability of ``e``, is 1 when both are uniform
and grows as the router favours a few experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Routing", "capacity", "route"]


def capacity(tokens: int, num_experts: int, k: int = 1, factor: float = 1.0) -> int:
    """Return the slots per expert for ``tokens`` tokens: ceil(factor * k * tokens / experts)."""
    if tokens < 0 or num_experts < 1 or not 1 <= k <= num_experts or factor <= 0:
        raise ValueError(
            f"need tokens >= 0, experts >= 1, 1 <= k <= experts and factor > 0; got tokens="
            f"{tokens}, experts={num_experts}, k={k}, factor={factor}"
        )
    return max(1, math.ceil(factor * k * tokens / num_experts))


@dataclass
class Routing:
    """Where a group's tokens go: ``expert``, ``slot`` (-1: dropped) and ``gate`` are (T, k)."""

    expert: torch.Tensor  # int64 (T, k): the expert of each choice
    slot: torch.Tensor  # int64 (T, k): the position in that expert's buffer, -1 when dropped
    gate: torch.Tensor  # float (T, k): the weight of each choice in the output (differentiable)
    capacity: int
    aux_loss: torch.Tensor  # the load-balancing loss of this group (differentiable)
    wanted: torch.Tensor  # int64 (E,): choices addressed to each expert, kept or not
    kept: torch.Tensor  # int64 (E,): choices each expert took (at most capacity)

    @property
    def dropped(self) -> int:
        """Choices that found their expert full."""
        return int((self.slot < 0).sum())


def route(logits: torch.Tensor, k: int, cap: int) -> Routing:
    """Route ``T`` tokens by their router ``logits`` (T, E) to their ``k`` best experts, ``cap`` slots each."""
    T, E = logits.shape
    probs = torch.softmax(logits.float(), dim=1)
    top, expert = probs.topk(k, dim=1)  # ties: the lower expert first, as topk orders them
    gate = top if k == 1 else top / top.sum(dim=1, keepdim=True)
    # slots: choice 0 of every token first, then choice 1, ...; a running count per expert
    order = expert.t().reshape(-1)  # (k*T,) in priority order
    one_hot = torch.nn.functional.one_hot(order, E)
    position = (one_hot.cumsum(0) - 1).gather(1, order[:, None])[:, 0]
    slot = torch.where(position < cap, position, torch.full_like(position, -1))
    slot = slot.reshape(k, T).t().contiguous()
    wanted = one_hot.sum(0)
    first = torch.nn.functional.one_hot(expert[:, 0], E).float().mean(0)  # f_e, not differentiable
    aux = E * (first * probs.mean(0)).sum()
    return Routing(expert, slot, gate, cap, aux, wanted, wanted.clamp(max=cap))
