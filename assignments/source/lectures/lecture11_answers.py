"""Instructor answers to lecture 11's exercises (memory: ZeRO's bytes per rank, stage 1's shard update)."""

from __future__ import annotations

import torch

__all__ = ["my_bytes_per_rank", "my_shard_update"]


def my_bytes_per_rank(stage: int, psi: int, world_size: int, mixed: bool) -> float:
    """Exercise 11.1: model-state bytes per rank with Adam at ZeRO ``stage`` (0 = DDP)."""
    weights, grads, state = (2, 2, 12) if mixed else (4, 4, 8)  # mixed: float32 master + m + v
    n = world_size
    if stage == 0:
        return (weights + grads + state) * psi
    if stage == 1:
        return (weights + grads) * psi + state * psi / n
    if stage == 2:
        return weights * psi + (grads + state) * psi / n
    return (weights + grads + state) * psi / n


def my_shard_update(weights, grad_sum, rank, world_size, m, v, step, lr):
    """Exercise 11.2: Adam on rank ``rank``'s chunk, from the reduce-scattered gradient sum."""
    beta1, beta2, eps = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults
    base, extra = divmod(weights.numel(), world_size)
    start = rank * base + min(rank, extra)  # the first `extra` chunks are one longer
    stop = start + base + (1 if rank < extra else 0)
    g = grad_sum / world_size  # the reduce-scatter summed: the mean is the sum / N
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
    return weights[start:stop] - lr * m_hat / (torch.sqrt(v_hat) + eps), m, v
