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

:func:`train_mixed_precision` holds the scheme's tensors themselves, so its 16 bytes can be
counted rather than predicted: the model *is* 16-bit (bfloat16 on CPU: float32's exponent range,
so no loss scale), and beside it sit the float32 master weights and Adam's float32 moments.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from course_lib.parallel.sharded.ledger import held_bytes

__all__ = ["mixed_precision_bytes", "train_autocast", "train_mixed_precision"]


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


def _held(net: nn.Module, master: list[nn.Parameter], opt: torch.optim.Optimizer) -> dict[str, int]:
    """Count the model state held now, by kind, each storage once (Adam's step counters left out)."""
    seen: set[int] = set()
    state = [t for s in opt.state.values() for t in s.values() if t.dim()]  # m, v
    return {
        "16-bit weights": held_bytes(net.parameters(), seen),
        "16-bit gradients": held_bytes([p.grad for p in net.parameters()], seen),
        "float32 master weights": held_bytes(master, seen),
        "Adam state (m, v)": held_bytes(state, seen),
    }


def train_mixed_precision(
    make_model: Callable[[], nn.Module],
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    dtype: torch.dtype = torch.bfloat16,
    master_weights: bool = True,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    test: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, object]:
    """Train with Adam on ``dtype`` weights and gradients, updating float32 master weights.

    Forward and backward run on the 16-bit model; for the update each 16-bit gradient is cast to
    float32 (a transient copy, freed after the step), Adam updates the float32 master weights
    with float32 moments, and the master weights are rounded back into the model. Small updates
    survive in float32 where a 16-bit weight would round them away (Micikevicius et al. 2018).
    ``master_weights=False`` drops the master copy: Adam then updates the 16-bit weights, with
    16-bit moments (the scheme's foil).

    Returns the float32 losses, ``held`` (the model-state bytes by kind, counted from the
    tensors after the last backward, when all four kinds are held), ``update_peak_bytes`` (the
    same plus the transient float32 gradients, counted during the update), ``psi`` and, given
    ``test``, the accuracy of the 16-bit model on it.
    """
    torch.manual_seed(seed)
    net = make_model()  # float32 initial weights, as in train_autocast
    master = [nn.Parameter(p.detach().clone()) for p in net.parameters()] if master_weights else []
    net.to(dtype)  # the model forward and backward run on: 16-bit weights, 16-bit gradients
    opt = torch.optim.Adam(master or net.parameters(), lr=lr)
    losses, held, peak = [], {}, 0
    for step in range(steps):
        idx = torch.arange(step * batch_size, (step + 1) * batch_size) % len(X)
        net.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(net(X[idx].to(dtype)).float(), y[idx])
        loss.backward()
        held = _held(net, master, opt)  # all four kinds held: the settled moment
        pairs = list(zip(master, net.parameters(), strict=True)) if master_weights else []
        for m, p in pairs:
            m.grad = p.grad.float()  # transient: Adam's update is float32 arithmetic
        peak = max(peak, sum(held.values()) + held_bytes([m.grad for m in master], set()))
        opt.step()
        with torch.no_grad():
            for m, p in pairs:
                p.copy_(m)  # round the updated master weights into the 16-bit model
                m.grad = None
        losses.append(float(loss.detach()))
    accuracy = None
    if test is not None:
        with torch.no_grad():
            accuracy = float((net(test[0].to(dtype)).argmax(1) == test[1]).float().mean())
    return {
        "losses": losses,
        "held": held,
        "update_peak_bytes": peak,
        "psi": sum(p.numel() for p in net.parameters()),
        "accuracy": accuracy,
    }
