"""Lecture 11: float16 training with dynamic loss scaling and float32 master weights, from scratch.

float16 keeps 10 bits of mantissa and 5 of exponent: its smallest normal number is 6.1e-5 and
its largest 65 504. Gradients of a trained network are often far below the first (they flush to
zero: the update is lost) while a large loss can overflow the second (inf). Micikevicius et al.
(2018), "Mixed Precision Training", keep a float32 *master* copy of the weights, run forward and
backward on a float16 copy, and multiply the loss by a scale S before backward so that the
gradients land in float16's range; the update divides by S again, in float32.

The scale is chosen *dynamically* (as PyTorch's ``torch.amp.GradScaler`` does): start large
(2^16); when a step's gradients hold an inf or a NaN the scale was too large, so the step is
**skipped** (the weights stay) and S is halved; after ``growth_interval`` clean steps in a row
S is doubled again. :class:`DynamicLossScaler` is that rule, written out;
``tests/lib/training/test_mixed_precision.py`` checks its decisions against ``GradScaler`` on the same
gradients, and :func:`train_float16` trains with it (its record shows every skipped step).
bfloat16 (8 bits of exponent, float32's range) needs no scaling: :mod:`.precision`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["DynamicLossScaler", "train_float16"]


@dataclass
class DynamicLossScaler:
    """The loss scale S: halve it and skip the step on inf / NaN, double it after a clean run."""

    scale: float = 2.0**16
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    clean_steps: int = 0  # clean steps since the last change of S
    skipped: list[int] = field(default_factory=list)  # the steps whose update was skipped

    def __post_init__(self) -> None:
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(
                f"scale must be a positive finite number (e.g. 2**16), got {self.scale}"
            )
        if self.growth_interval < 1 or self.growth_factor <= 1 or not 0 < self.backoff_factor < 1:
            raise ValueError(
                "need growth_interval >= 1, growth_factor > 1 and 0 < backoff_factor < 1, got "
                f"{self.growth_interval}, {self.growth_factor}, {self.backoff_factor}"
            )

    def unscale(self, grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], bool]:
        """Return the gradients divided by S in float32, and whether all of them are finite."""
        out = [g.float() / self.scale for g in grads]
        return out, all(bool(torch.isfinite(g).all()) for g in out)

    def update(self, finite: bool, step: int) -> bool:
        """Record step ``step``'s outcome and adapt S; return True when the update may be applied."""
        if not finite:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped.append(step)
            return False
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0
        return True


def train_float16(
    make_model: Callable[[], nn.Module],
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    scaler: DynamicLossScaler | None,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    test: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, object]:
    """Train with Adam: forward and backward in float16, the update on float32 master weights.

    ``scaler`` None trains without loss scaling (S = 1, no step skipped). Returns the float32
    losses, the scale before each step, the skipped steps, the fraction of gradient values that
    were 0 in float16 although their float32 value was not (underflow, last step), the master
    weights and, given ``test``, the accuracy of the master weights in float32.
    """
    torch.manual_seed(seed)
    master = make_model()  # float32: what the optimiser updates
    half = copy.deepcopy(master).half()  # float16: what forward and backward run on
    opt = torch.optim.Adam(master.parameters(), lr=lr)
    losses, scales = [], []
    for step in range(steps):
        idx = torch.arange(step * batch_size, (step + 1) * batch_size) % len(X)
        with torch.no_grad():  # this step's float16 copy of the master weights
            for h, m in zip(half.parameters(), master.parameters(), strict=True):
                h.copy_(m)
        half.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(half(X[idx].half()).float(), y[idx])
        scale = scaler.scale if scaler is not None else 1.0
        scales.append(scale)
        (loss * scale).backward()  # the scaled loss: gradients S times larger, in float16
        grads16 = [p.grad for p in half.parameters()]
        if scaler is not None:
            grads, finite = scaler.unscale(grads16)
            apply = scaler.update(finite, step)
        else:
            grads, apply = [g.float() for g in grads16], True
        if apply:
            for m, g in zip(master.parameters(), grads, strict=True):
                m.grad = g
            opt.step()
        losses.append(float(loss.detach()))
    # Underflow: of the trained model's float32 gradient times the last S, the share of nonzero
    # values that are 0 in float16 (what the scale is there to rescue).
    ref = copy.deepcopy(master)
    nn.functional.cross_entropy(ref(X[:batch_size]), y[:batch_size]).backward()
    exact = torch.cat([p.grad.reshape(-1) * scales[-1] for p in ref.parameters()])
    nonzero = exact != 0
    underflow = float(((exact.half() == 0) & nonzero).sum() / nonzero.sum().clamp(min=1))
    accuracy = None
    if test is not None:
        with torch.no_grad():
            accuracy = float((master(test[0]).argmax(1) == test[1]).float().mean())
    return {
        "losses": losses,
        "scales": scales,
        "skipped": list(scaler.skipped) if scaler is not None else [],
        "underflow": underflow,
        "accuracy": accuracy,
        "weights": {k: v.detach().clone() for k, v in master.state_dict().items()},
    }
