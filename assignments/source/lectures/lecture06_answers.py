"""Instructor answers to lecture 6's exercises (notebooks/06_topologies.ipynb)."""

from __future__ import annotations

import numpy as np

__all__ = ["my_gossip_matrix", "my_spectral_gap"]


def my_gossip_matrix(world_size: int, s: int) -> np.ndarray:
    """Exercise 6.1: 1/3 on self and on each partner, added (a shared partner gets 2/3)."""
    from course_lib.collectives.gossip import gossip_partners

    w = np.zeros((world_size, world_size))
    for i in range(world_size):
        left, right = gossip_partners(i, world_size, s)
        w[i, i] += 1 / 3
        w[i, left] += 1 / 3
        w[i, right] += 1 / 3
    return w


def my_spectral_gap(w: np.ndarray) -> float:
    """Exercise 6.2: 1 - ||W - J||_2, the largest singular value (W need not be symmetric)."""
    p = w.shape[0]
    return float(1 - np.linalg.norm(w - np.full((p, p), 1 / p), 2))
