"""Lecture 6: Mixing matrices: every averaging scheme as a P x P matrix W, and what its spectrum predicts.

One averaging step replaces the stacked replicas X (one row per rank) by W X. Allreduce is
W = J (every entry 1/P); gossip at distance s puts 1/3 on the diagonal and on the partners
``i - s`` and ``i + s`` (source 001's "K"); a rotation s = 1..P/2 is the product of those.
Every such W is doubly stochastic, so the mean of the replicas never moves, and the distance
from it shrinks by at most $\\lambda = \\lVert W - J \\rVert_2$ per step (the second-largest
singular value): the **spectral gap** $1 - \\lambda$ says how fast consensus comes (Boyd et al.
2006, "Randomized gossip algorithms"). Allreduce has gap 1 (consensus in one step); the ring
with 1/3 weights has eigenvalues $(1 + 2\\cos(2\\pi k / P)) / 3$, so its gap shrinks like $1/P^2$.

**Drift.** Between averagings each replica moves by its own noisy gradient. Model that noise as
independent, variance $\\sigma^2$ per rank and step: the covariance C of the replicas follows
$C \\leftarrow C + \\sigma^2 I$ per local step and $C \\leftarrow W C W^T$ per averaging, and the
mean squared distance from the mean is $\\operatorname{tr}((I - J) C (I - J)) / P$.
:func:`predict_drift` runs that recursion, so its shape comes from the matrices alone and
``sigma`` only scales it (:func:`fit_noise_scale` fits that one number to a measurement).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from course_lib.collectives.gossip import gossip_partners, next_distance

__all__ = [
    "allreduce_matrix",
    "contraction",
    "fit_noise_scale",
    "gossip_distances",
    "gossip_matrix",
    "is_doubly_stochastic",
    "predict_consensus",
    "predict_drift",
    "rotation_product",
    "scheme_schedule",
    "spectral_gap",
]


def allreduce_matrix(world_size: int) -> np.ndarray:
    """Return J: every rank gets the mean of all (every entry 1/P)."""
    return np.full((world_size, world_size), 1.0 / world_size)


def gossip_matrix(world_size: int, s: int = 1) -> np.ndarray:
    """Return the matrix of one gossip step at distance ``s``: 1/3 on self, left and right.

    When the two partners coincide (P = 2, or s = P/2) that partner gets 2/3, as
    :func:`~course_lib.collectives.gossip.gossip_step` counts its one exchange twice.
    """
    if world_size == 1:
        return np.ones((1, 1))
    if not 1 <= s < world_size:
        raise ValueError(f"distance s must be in 1..{world_size - 1}, got {s}")
    w = np.zeros((world_size, world_size))
    for i in range(world_size):
        left, right = gossip_partners(i, world_size, s)
        w[i, i] += 1 / 3
        w[i, left] += 1 / 3
        w[i, right] += 1 / 3
    return w


def gossip_distances(world_size: int, steps: int) -> list[int]:
    """Return the partner distance of each of ``steps`` gossip steps: s = 1, 2, .., P/2, 1, .."""
    out, s = [], 1
    for _ in range(steps):
        out.append(s)
        s = next_distance(s, world_size)
    return out


def rotation_product(world_size: int) -> np.ndarray:
    """Return the matrix of one whole rotation: the gossip steps s = 1..P/2 applied in order."""
    cycle = max(1, world_size // 2)
    w = np.eye(world_size)
    for s in gossip_distances(world_size, cycle):
        w = gossip_matrix(world_size, s) @ w
    return w


def is_doubly_stochastic(w: np.ndarray, atol: float = 1e-12) -> bool:
    """Return True when ``w`` is nonnegative and every row and column sums to 1."""
    return bool(
        (w >= -atol).all()
        and np.allclose(w.sum(axis=0), 1, atol=atol)
        and np.allclose(w.sum(axis=1), 1, atol=atol)
    )


def contraction(w: np.ndarray) -> float:
    """Return $\\lVert W - J \\rVert_2$: the most one step can leave of a distance from the mean."""
    p = w.shape[0]
    return float(np.linalg.norm(w - allreduce_matrix(p), 2))


def spectral_gap(w: np.ndarray) -> float:
    """Return $1 - \\lVert W - J \\rVert_2$ (symmetric W: 1 - the second-largest |eigenvalue|)."""
    return 1.0 - contraction(w)


def predict_consensus(matrices: Sequence[np.ndarray], distance0: float) -> np.ndarray:
    """Return the bound on the distance from the mean after each step: ``distance0`` times the
    running product of the steps' contractions (the first entry is ``distance0``)."""
    factors = [contraction(w) for w in matrices]
    return distance0 * np.concatenate([[1.0], np.cumprod(factors)])


def scheme_schedule(
    world_size: int, steps: int, period: int = 1, averaging: str = "allreduce"
) -> list[np.ndarray | None]:
    """Return, for each step, the matrix applied to the weights after it (None: no averaging).

    ``averaging``: ``"allreduce"`` or ``"gossip"`` (weights, rotating s, every ``period``
    steps), or ``"none"`` (replicas never mix: also source 001's gradient gossip, whose
    weights are never averaged).
    """
    out: list[np.ndarray | None] = [None] * steps
    if averaging == "none" or world_size == 1:
        return out
    sync_steps = [k for k in range(steps) if (k + 1) % period == 0]
    if averaging == "allreduce":
        for k in sync_steps:
            out[k] = allreduce_matrix(world_size)
    elif averaging == "gossip":
        for k, s in zip(sync_steps, gossip_distances(world_size, len(sync_steps)), strict=True):
            out[k] = gossip_matrix(world_size, s)
    else:
        raise ValueError(f"averaging={averaging!r}: choose 'allreduce', 'gossip' or 'none'")
    return out


def predict_drift(
    schedule: Sequence[np.ndarray | None],
    world_size: int,
    sigma: float = 1.0,
    noise_mixing: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """Return the predicted RMS distance of a replica from the mean after each step.

    Each step adds independent noise of variance ``sigma**2`` to every replica (first mixed
    by that step's ``noise_mixing`` matrix M, covariance $\\sigma^2 M M^T$: source 001's
    gradient gossip, which mixes the gradients and never the weights), then applies that
    step's ``schedule`` matrix to the weights (None: none). Proportional to ``sigma``; with no
    mixing at all it is the random walk $\\sigma \\sqrt{k (P - 1) / P}$.
    """
    p = world_size
    centre = np.eye(p) - allreduce_matrix(p)
    cov = np.zeros((p, p))
    out = []
    for k, w in enumerate(schedule):
        m = noise_mixing[k] if noise_mixing is not None else np.eye(p)
        cov = cov + sigma**2 * (m @ m.T)
        if w is not None:
            cov = w @ cov @ w.T
        out.append(np.sqrt(max(np.trace(centre @ cov @ centre), 0.0) / p))
    return np.array(out)


def fit_noise_scale(predicted_unit: np.ndarray, measured: np.ndarray) -> float:
    """Return the ``sigma`` that best scales a ``sigma = 1`` prediction onto ``measured``."""
    a, b = np.asarray(predicted_unit, float), np.asarray(measured, float)
    denom = float(a @ a)
    if denom == 0:
        raise ValueError("the prediction is zero everywhere: nothing to scale")
    return float(a @ b) / denom
