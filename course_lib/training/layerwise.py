"""Lecture 12: LARS and LAMB, optimisers that scale each layer's step by a trust ratio ||w|| / ||update||.

At large batch the linear scaling rule asks for learning rates at which some layers' updates
are larger than their weights and training diverges. You, Gitman & Ginsburg (2017, "Large Batch
Training of Convolutional Networks", LARS) give every layer its own step size proportional to
$\\|w\\| / \\|\\nabla L(w)\\|$; You et al. (2019, "Large Batch Optimization for Deep Learning:
Training BERT in 76 minutes", LAMB) apply the same trust ratio to Adam's update. A "layer" is one
parameter tensor here (a weight matrix, a bias vector), as in both papers' implementations.

Both are written from the papers' algorithms (LARS: Algorithm 1; LAMB: Algorithm 2 with
$\\phi(z) = z$) and follow the reference implementations (TensorFlow's ``LARSOptimizer`` and
LAMB, NVIDIA Apex's ``LARC`` and ``FusedLAMB``) where the papers are silent: where a norm is 0 (a
bias initialised at zero, a gradient that vanished) the ratio is undefined and the *trust ratio*
is 1, so LARS's local rate there is 1, not the trust coefficient $\\eta$ (which would move a zero
bias 1/eta = 1000 times less than the references do); and biases and normalisation parameters
(tensors of one dimension) are excluded from the adaptation and from weight decay (SimCLR's and
BERT's settings, ``exclude_bias_and_norm=False`` to adapt them too). The learning rate is the
*global* one ($\\gamma_t$, $\\eta_t$): a schedule (warm-up, decay) sets it from outside, as for any
torch optimiser.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["LAMB", "LARS"]


def _trust_ratio(weight_norm: torch.Tensor, update_norm: torch.Tensor) -> torch.Tensor:
    """Return ``weight_norm / update_norm``, or 1 where either is 0 (undefined there)."""
    ok = (weight_norm > 0) & (update_norm > 0)
    return torch.where(ok, weight_norm / torch.where(ok, update_norm, 1.0), 1.0)


def _check(name: str, value: float, low: float, high: float | None, advice: str) -> None:
    if not (value >= low and (high is None or value < high)):
        bounds = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{name} must be {bounds}, got {value} ({advice})")


def _adapted(w: torch.Tensor, exclude_bias_and_norm: bool) -> bool:
    """True when ``w`` takes part in the layer-wise adaptation (biases and norms, 1-D, may not)."""
    return not (exclude_bias_and_norm and w.dim() <= 1)


class LARS(torch.optim.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al. 2017, Algorithm 1); ``step()`` updates in place.

    For each parameter tensor $w$ with gradient $g$, weight decay $\\beta$, momentum $m$, trust
    coefficient $\\eta$ and global learning rate $\\gamma$:
    $\\lambda = \\eta \\|w\\| / (\\|g\\| + \\beta \\|w\\|)$ (1 where $\\|w\\|$ or $\\|g\\|$ is 0),
    $v \\leftarrow m v + \\gamma \\lambda (g + \\beta w)$, $w \\leftarrow w - v$. An excluded
    tensor (a bias or norm, ``exclude_bias_and_norm``) takes $\\lambda = 1$ and no weight decay.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        exclude_bias_and_norm: bool = True,
    ) -> None:
        _check("lr", lr, 1e-300, None, "the global learning rate, e.g. 1 to 10 with LARS")
        _check("momentum", momentum, 0.0, 1.0, "0.9 in the paper")
        _check("weight_decay", weight_decay, 0.0, None, "5e-4 in the paper; 0 for none")
        _check("trust_coefficient", trust_coefficient, 1e-300, None, "the paper's eta, 0.001")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "trust_coefficient": trust_coefficient,
            "exclude_bias_and_norm": bool(exclude_bias_and_norm),
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Do one LARS step on every parameter that has a gradient; return the closure's loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            momentum = group["momentum"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                g = w.grad
                if _adapted(w, group["exclude_bias_and_norm"]):
                    decay = group["weight_decay"]
                    w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
                    # the paper divides by ||g|| + beta ||w||, the norm bound of g + beta w; the
                    # references take 1 (not eta) where ||w|| or ||g|| is 0
                    ok = (w_norm > 0) & (g_norm > 0)
                    ratio = group["trust_coefficient"] * w_norm / (g_norm + decay * w_norm)
                    local = torch.where(ok, ratio, 1.0)
                else:  # a bias or a norm: plain momentum SGD at the global rate, no decay
                    decay, local = 0.0, torch.tensor(1.0, dtype=w.dtype)
                update = (g + decay * w).mul_(group["lr"] * local)
                state = self.state[w]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(w)
                velocity = state["velocity"]
                velocity.mul_(momentum).add_(update)
                w.sub_(velocity)
        return loss


class LAMB(torch.optim.Optimizer):
    """Layer-wise Adaptive Moments for Batch training (You et al. 2019, Algorithm 2); in place.

    Adam's moments with bias correction, $r = \\hat m / (\\sqrt{\\hat v} + \\epsilon)$, then for
    each parameter tensor
    $w \\leftarrow w - \\eta \\frac{\\|w\\|}{\\|r + \\lambda w\\|} (r + \\lambda w)$
    (weight decay $\\lambda$ decoupled from the moments, as in AdamW; the ratio is 1 where a norm
    is 0). An excluded tensor (a bias or norm, ``exclude_bias_and_norm``) takes ratio 1 and no
    weight decay: Adam's step.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        exclude_bias_and_norm: bool = True,
    ) -> None:
        _check("lr", lr, 1e-300, None, "the global learning rate, e.g. 1e-3 to 1e-2")
        if len(betas) != 2:
            raise ValueError(f"betas must be two numbers (beta1, beta2), got {betas!r}")
        _check("betas[0]", betas[0], 0.0, 1.0, "the first moment's decay, 0.9 in the paper")
        _check("betas[1]", betas[1], 0.0, 1.0, "the second moment's decay, 0.999 in the paper")
        _check("eps", eps, 1e-300, None, "a small positive number, 1e-6 in the paper")
        _check("weight_decay", weight_decay, 0.0, None, "0.01 for BERT in the paper; 0 for none")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "exclude_bias_and_norm": bool(exclude_bias_and_norm)}  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Do one LAMB step on every parameter that has a gradient; return the closure's loss."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                g = w.grad
                state = self.state[w]
                if not state:
                    state.update(step=0, m=torch.zeros_like(w), v=torch.zeros_like(w))
                state["step"] += 1
                t, m, v = state["step"], state["m"], state["v"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)  # bias correction
                r = m_hat / (v_hat.sqrt() + group["eps"])
                if not _adapted(w, group["exclude_bias_and_norm"]):
                    w.sub_(r.mul_(group["lr"]))  # a bias or a norm: Adam's step, no decay
                    continue
                update = r + group["weight_decay"] * w
                ratio = _trust_ratio(torch.linalg.vector_norm(w), torch.linalg.vector_norm(update))
                w.sub_(update.mul_(group["lr"] * ratio))
        return loss
