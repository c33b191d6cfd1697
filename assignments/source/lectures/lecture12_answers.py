"""Instructor answers to lecture 12's exercises (large batches); the notebook ships stubs.

Each function has the notebook's name and is written from the papers, without the library's
``LinearScalingWarmup``, ``noise_estimates`` or ``LARS`` (the checks refuse answers that call
them).
"""

from __future__ import annotations

import numpy as np

__all__ = ["my_goyal_lr", "my_lars_update", "my_noise_estimates"]


def my_goyal_lr(
    step: int,
    *,
    base_lr: float,
    batch_size: int,
    reference_batch: int,
    warmup_steps: int,
    decay_steps: tuple[int, ...] = (),
) -> float:
    """Exercise 12.1: Goyal et al.'s schedule: linear scaling, gradual warm-up, then /10 decays."""
    ### BEGIN SOLUTION
    peak = base_lr * batch_size / reference_batch  # the linear scaling rule
    if step < warmup_steps:  # from the small-batch lr up to the peak, a constant amount a step
        return base_lr + (peak - base_lr) * step / warmup_steps
    return peak * 0.1 ** sum(step >= d for d in decay_steps)
    ### END SOLUTION


def my_noise_estimates(
    local_sq_norms: list[float], averaged_sq_norm: float, local_batch: int
) -> tuple[float, float]:
    """Exercise 12.2: unbiased ``(|G|^2, tr(Sigma))`` from the ranks' and the averaged norms."""
    ### BEGIN SOLUTION
    b = local_batch
    big = b * len(local_sq_norms)  # the averaged gradient is over N b examples
    small_sq = float(np.mean(local_sq_norms))  # E|G_b|^2 = |G|^2 + tr(Sigma) / b
    grad_sq = (big * averaged_sq_norm - b * small_sq) / (big - b)
    trace = (small_sq - averaged_sq_norm) / (1 / b - 1 / big)
    return grad_sq, trace
    ### END SOLUTION


def my_lars_update(
    w: np.ndarray,
    g: np.ndarray,
    v: np.ndarray,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    eta: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Exercise 12.3: one LARS step of one layer (You et al. 2017, Algorithm 1): new (w, v)."""
    ### BEGIN SOLUTION
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    # undefined when a norm is 0 (a bias at zero): trust ratio 1, as TensorFlow's and Apex's code
    ok = w_norm > 0 and g_norm > 0
    local = eta * w_norm / (g_norm + weight_decay * w_norm) if ok else 1.0
    v = momentum * v + lr * local * (g + weight_decay * w)
    return w - v, v
    ### END SOLUTION
