"""Lecture 7: Unbiased quantisation with few levels: QSGD (Alistarh et al. 2017), and 1-bit sign with a scale.

QSGD with ``s`` levels sends, for each value, its sign and a level $\\ell \\in \\{0, .., s\\}$ of
$|g_i| / \\|g\\|_2$: the level below with probability 1 - p and the level above with p, where p is
how far the value lies past the lower level. So $E[\\hat g_i] = g_i$ (unbiased) and the error of
one value is at most $\\|g\\|_2 / s$. Source 001 (Tang et al.'s survey): 32 -> 4 bits with good
convergence; here the levels travel as int8 (a lossless stage squeezes the unused bits).
The norm is computed in float64: in float32 the squares of 1e20 overflow (the norm became inf
and the values NaN) and those of 1e-23 underflow (the norm became 0 and the values zeros).

Sign sends one bit a value and one float32 scale, the mean $|g_i|$: the scaled sign of
Karimireddy et al. 2019 (EF-signSGD), after Seide et al. 2014's 1-bit SGD. It is biased;
with error feedback it converges like SGD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from course_lib.compression.base import Compressor, Payload, as_float32, check_finite, payload_of

__all__ = ["QSGD", "QSGDSettings", "Sign", "SignSettings"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class QSGDSettings:
    """``levels``: s, the number of non-zero levels (1..127); ``seed`` of the random rounding."""

    levels: int = 7
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.levels, (int, np.integer)) and 1 <= self.levels <= 127):
            raise ValueError(
                f"levels={self.levels!r}: QSGD needs 1..127 levels (they travel as int8); "
                "s=7 is sign + 3 bits (4 bits a value), s=1 is ternary"
            )


class QSGD(Compressor):
    """QSGD: sign and a stochastically rounded level of $|g_i| / \\|g\\|_2$, unbiased."""

    name = "qsgd"
    unbiased = True

    def __init__(self, settings: QSGDSettings | None = None, **kwargs: Any) -> None:
        self.settings = settings or QSGDSettings(**kwargs)
        self.reseed(0)

    def reseed(self, stream: int) -> None:
        """Restart the random rounding for ``stream`` (the exchange passes the rank)."""
        self.rng = np.random.default_rng([self.settings.seed, stream])

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Return ``q`` (sign x level, int8) and ``norm`` (float32) for ``tensor``."""
        flat, shape, dtype = as_float32(tensor)
        check_finite(flat, name, "QSGD")
        s = self.settings.levels
        norm = _float32_norm(flat, name)
        if norm == 0:
            q = np.zeros(flat.size, np.int8)
        else:
            # |g_i| <= norm, so r is in [0, s]; the clip catches the float32 norm rounded down
            r = np.minimum(np.abs(flat) / norm * np.float32(s), np.float32(s))
            low = np.floor(r)
            up = self.rng.random(flat.size, dtype=np.float32) < (r - low)  # P(up) = r - low
            q = (np.sign(flat) * (low + up)).astype(np.int8)
        return payload_of(self.name, shape, dtype, q=q, norm=np.array([norm], np.float32)), None

    def decode_values(self, payload: Payload) -> np.ndarray:
        """Return ``q * norm / s``."""
        step = np.float32(payload.parts["norm"][0]) / np.float32(self.settings.levels)
        return payload.parts["q"].astype(np.float32) * step


def _float32_norm(flat: np.ndarray, name: str) -> np.float32:
    """Return $\\|g\\|_2$ computed in float64 and rounded to float32, the width it travels in."""
    norm = float(np.linalg.norm(flat.astype(np.float64))) if flat.size else 0.0
    if norm > _FLOAT32_MAX:
        raise ValueError(
            f"gradient {name or '(unnamed)'} has norm {norm:.3g}, above {_FLOAT32_MAX:.3g}, the "
            "largest float32 (QSGD sends the norm as one): clip gradients "
            "(torch.nn.utils.clip_grad_norm_) or lower the learning rate"
        )
    return np.float32(norm)


def _mean_abs(flat: np.ndarray) -> float:
    """Return the mean $|g_i|$ in float32, or in float64 where float32's sum overflows."""
    if not flat.size:
        return 0.0
    with np.errstate(over="ignore"):
        mean = np.abs(flat).mean()
    # near 3e38 the float32 sum overflows though the mean fits; float32 elsewhere keeps the bits
    return float(mean) if np.isfinite(mean) else float(np.abs(flat).mean(dtype=np.float64))


@dataclass(frozen=True)
class SignSettings:
    """``scale``: ``"mean"`` (send mean |g| and decode +-mean) or ``"none"`` (plain +-1, signSGD)."""

    scale: str = "mean"

    def __post_init__(self) -> None:
        if self.scale not in ("mean", "none"):
            raise ValueError(
                f"scale={self.scale!r}: use 'mean' (EF-signSGD, Karimireddy et al. 2019) or "
                "'none' (signSGD, Bernstein et al. 2018; then lower the learning rate a lot)"
            )


class Sign(Compressor):
    """1 bit a value (the sign) plus one float32 scale: 32x fewer bytes, biased."""

    name = "sign"

    def __init__(self, settings: SignSettings | None = None, **kwargs: Any) -> None:
        self.settings = settings or SignSettings(**kwargs)

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Return ``bits`` (1 where negative, packed 8 a byte) and ``scale`` for ``tensor``."""
        flat, shape, dtype = as_float32(tensor)
        check_finite(flat, name, "sign")
        if self.settings.scale == "mean":
            scale = np.float32(_mean_abs(flat))
        else:
            scale = np.float32(1)
        bits = np.packbits(flat < 0)
        return payload_of(
            self.name, shape, dtype, bits=bits, scale=np.array([scale], np.float32)
        ), None

    def decode_values(self, payload: Payload) -> np.ndarray:
        """Return ``scale`` where the bit is 0 and ``-scale`` where it is 1."""
        negative = np.unpackbits(payload.parts["bits"], count=payload.numel).astype(np.float32)
        return (np.float32(1) - np.float32(2) * negative) * np.float32(payload.parts["scale"][0])
