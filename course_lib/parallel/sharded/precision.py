"""Lecture 11: Mixed precision: 16 bytes per parameter with Adam, and bfloat16 autocast on CPU beside float32.

Mixed-precision Adam (Micikevicius et al. 2018; the accounting of ZeRO, Rajbhandari et al.
2020) keeps 16-bit weights and gradients for forward and backward (2 + 2 bytes per value) and,
for the update, a float32 *master* copy of the weights and Adam's two float32 moments (K = 12
bytes): 16 bytes per value, as many as float32 Adam (4 + 4 + 8). Mixed precision saves
activation memory and time on hardware with fast 16-bit arithmetic, not model-state memory;
sharding (ZeRO) is what divides the 16.

:func:`train_autocast` trains with ``torch.autocast("cpu", dtype=torch.bfloat16)``: the weights
stay float32 (they are the master copy; autocast casts them to bfloat16 for each matrix
product), so every update is a float32 update of float32 weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["mixed_precision_bytes", "train_autocast"]


def mixed_precision_bytes(stage: int, psi: float, world_size: int, k: int = 12) -> float:
    """Return mixed-precision model-state bytes per rank of ``stage`` (0 = DDP): 2 + 2 + ``k`` per value."""
    n = world_size
    formulas = {
        0: (4 + k) * psi,
        1: 4 * psi + k * psi / n,
        2: 2 * psi + (2 + k) * psi / n,
        3: (4 + k) * psi / n,
    }
    if stage not in formulas:
        raise ValueError(f"stage={stage!r}: ZeRO has stages 0 (plain DDP), 1, 2 and 3")
    return formulas[stage]


def train_autocast(
    make_model: Callable[[], nn.Module],
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    dtype: torch.dtype | None,
    steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    test: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, object]:
    """Train with Adam for ``steps`` batches, forward under autocast to ``dtype`` (None: float32).

    Returns the losses, the final weights (float32: the master copy), the dtype of the
    logits the forward pass produced (bfloat16 under autocast) and, given ``test`` (inputs,
    labels), the accuracy on it (evaluated under the same autocast).
    """
    torch.manual_seed(seed)
    net = make_model()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    losses, logits_dtype = [], None
    for step in range(steps):
        idx = torch.arange(step * batch_size, (step + 1) * batch_size) % len(X)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = net(X[idx])
            logits_dtype = logits.dtype
        loss = nn.functional.cross_entropy(logits.float(), y[idx])  # the loss in float32
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    accuracy = None
    if test is not None:
        with (
            torch.no_grad(),
            torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None),
        ):
            accuracy = float((net(test[0]).argmax(1) == test[1]).float().mean())
    return {
        "losses": losses,
        "accuracy": accuracy,
        "weights": {k: v.detach().clone() for k, v in net.state_dict().items()},
        "logits_dtype": logits_dtype,
        "weights_dtype": next(net.parameters()).dtype,
    }
