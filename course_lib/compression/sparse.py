"""Lecture 7: Sparsification: send some values with their indices, take the rest as zero.

* ``threshold`` (source 001, Algorithm 3): every value with $|g_i| > t$; t = 1 sent 5 % of the
  values in their trials. How many survive depends on the gradient, so the payload's size varies.
* ``topk``: the ``k`` values largest in magnitude (Aji & Heafield 2017; Deep Gradient Compression,
  Lin et al. 2018, sent 0.1 % with error feedback and lost nothing). Biased.
* ``randomk``: ``k`` values picked uniformly at random, scaled by n / k so that the mean over
  the draws is the gradient (unbiased; Stich et al. 2018), at the price of much more variance.

Every rank keeps different indices, so the payloads cannot be summed by an allreduce (source 001
judged the same): they are gathered, or sent to a parameter server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from course_lib.compression.base import (
    Compressor,
    Payload,
    PayloadError,
    finite_float32,
    payload_of,
)

__all__ = [
    "RandomK",
    "SparseSettings",
    "Threshold",
    "ThresholdSettings",
    "TopK",
    "scatter_values",
]


def _indices(idx: np.ndarray, numel: int) -> np.ndarray:
    if numel >= 2**32:
        raise ValueError(f"a tensor of {numel} values is too large for 32-bit indices: split it")
    return idx.astype(np.uint32)


def scatter_values(indices: np.ndarray, values: np.ndarray, numel: int) -> np.ndarray:
    """Return a float32 vector of ``numel`` zeros with ``values`` placed at ``indices``."""
    if indices.size != values.size:
        raise PayloadError(f"sparse payload has {indices.size} indices but {values.size} values")
    if indices.size and int(indices.max()) >= numel:
        raise PayloadError(f"sparse payload has index {int(indices.max())} in a tensor of {numel}")
    out = np.zeros(numel, np.float32)
    out[indices] = values
    return out


class _Sparse(Compressor):
    """A payload of ``indices`` (uint32) and ``values`` (float32)."""

    def decode_values(self, payload: Payload) -> np.ndarray:
        """Return the dense vector: the sent values at their indices, zeros elsewhere."""
        return scatter_values(payload.parts["indices"], payload.parts["values"], payload.numel)

    def _payload(
        self, shape: tuple[int, ...], dtype: str, idx: np.ndarray, values: np.ndarray, numel: int
    ) -> Payload:
        """Return the payload of ``values`` at indices ``idx`` of a tensor of ``numel`` values."""
        return payload_of(self.name, shape, dtype, indices=_indices(idx, numel), values=values)


@dataclass(frozen=True)
class ThresholdSettings:
    """``threshold``: send values whose magnitude exceeds it (source 001's best: 1)."""

    threshold: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(
                f"threshold={self.threshold!r}: use a finite t >= 0 (values with |g| > t are "
                "sent; source 001 used t = 1; look at a gradient's histogram to choose)"
            )


class Threshold(_Sparse):
    """Send every value with $|g_i| > t$ and its index (source 001)."""

    name = "threshold"

    def __init__(self, settings: ThresholdSettings | None = None, **kwargs: Any) -> None:
        self.settings = settings or ThresholdSettings(**kwargs)

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Return the indices and values of ``tensor`` above the threshold."""
        flat, shape, dtype = finite_float32(tensor, name, "threshold sparsification")
        idx = np.flatnonzero(np.abs(flat) > np.float32(self.settings.threshold))
        return self._payload(shape, dtype, idx, flat[idx], flat.size), None


@dataclass(frozen=True)
class SparseSettings:
    """``ratio``: the fraction of values sent (0 < ratio <= 1; at least one); ``seed`` for randomk."""

    ratio: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio <= 1):
            raise ValueError(
                f"ratio={self.ratio!r}: give the fraction of values to send, 0 < ratio <= 1 "
                "(0.01 sends 1 %; Deep Gradient Compression sent 0.001 with error feedback)"
            )

    def count(self, numel: int) -> int:
        """Return k, the number of values sent out of ``numel`` (at least one when numel > 0)."""
        return min(numel, max(1, math.ceil(self.ratio * numel))) if numel else 0


class TopK(_Sparse):
    """Send the ``k`` values largest in magnitude with their indices (sorted): biased."""

    name = "topk"

    def __init__(self, settings: SparseSettings | None = None, **kwargs: Any) -> None:
        self.settings = settings or SparseSettings(**kwargs)

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Return the indices and values of the ``k`` largest magnitudes of ``tensor``."""
        flat, shape, dtype = finite_float32(tensor, name, "top-k")
        k = self.settings.count(flat.size)
        idx = np.sort(np.argpartition(np.abs(flat), flat.size - k)[flat.size - k :]) if k else []
        idx = np.asarray(idx, dtype=np.int64)
        return self._payload(shape, dtype, idx, flat[idx], flat.size), None


class RandomK(_Sparse):
    """Send ``k`` values drawn uniformly without replacement, scaled by n / k: unbiased."""

    name = "randomk"
    unbiased = True

    def __init__(self, settings: SparseSettings | None = None, **kwargs: Any) -> None:
        self.settings = settings or SparseSettings(**kwargs)
        self.reseed(0)

    def reseed(self, stream: int) -> None:
        """Restart the random choice for ``stream`` (the exchange passes the rank)."""
        self.rng = np.random.default_rng([self.settings.seed, stream])

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Return ``k`` random indices of ``tensor`` and their values times n / k."""
        flat, shape, dtype = finite_float32(tensor, name, "random-k")
        n, k = flat.size, self.settings.count(flat.size)
        idx = np.sort(self.rng.choice(n, size=k, replace=False)) if k else np.zeros(0, np.int64)
        # Each index is kept with probability k / n; scaling by n / k makes E[decoded] = g.
        values = flat[idx] * np.float32(n / k) if k else flat[idx]
        return self._payload(shape, dtype, idx, values, n), None
