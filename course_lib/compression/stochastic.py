"""Lecture 7: Unbiased quantisation with few levels: QSGD (Alistarh et al. 2017), and 1-bit sign with a scale.

QSGD with ``s`` levels cuts the flat gradient into buckets of ``d`` values (default 512, as in
the paper's experiments) and sends, per bucket, one norm $\\|g_b\\|_2$ (float32) and, per value,
its sign and a level $\\ell \\in \\{0, .., s\\}$ of $|g_i| / \\|g_b\\|_2$: the level below with
probability 1 - p and the level above with p, where p is how far the value lies past the lower
level. So $E[\\hat g_i] = g_i$ (unbiased), the error of one value is at most $\\|g_b\\|_2 / s$, and
(Alistarh et al., Lemma 3.1) $E\\|\\hat g_b - g_b\\|^2 \\le \\min(d/s^2, \\sqrt d/s)\\,\\|g_b\\|^2$ per
bucket: the bucket keeps $\\sqrt d$, not $\\sqrt n$, in the bound. Each value travels as the code
$\\ell \\cdot \\mathrm{sign} + s \\in \\{0, .., 2s\\}$ in $\\lceil \\log_2(2s+1) \\rceil$ bits, packed
(4 bits at s = 7: source 001's "32 -> 4 bits"; 2 bits at s = 1), so n values take
$\\lceil n \\cdot bits / 8 \\rceil + 4 \\lceil n / d \\rceil$ bytes.
Each norm is computed in float64: in float32 the squares of 1e20 overflow (the norm became inf
and the values NaN) and those of 1e-23 underflow (the norm became 0 and the values zeros); a
norm float32 cannot hold is refused.

Sign sends one bit a value and one float32 scale, the mean $|g_i|$: the scaled sign of
Karimireddy et al. 2019 (EF-signSGD), after Seide et al. 2014's 1-bit SGD. It is biased;
with error feedback it converges like SGD.
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
    as_float32,
    finite_float32,
    payload_of,
)

__all__ = [
    "QSGD",
    "QSGDSettings",
    "Sign",
    "SignSettings",
    "pack_levels",
    "qsgd_bits",
    "qsgd_variance_bound",
    "unpack_levels",
]

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def qsgd_bits(levels: int) -> int:
    """Return $\\lceil \\log_2(2s+1) \\rceil$, the bits one value's sign and level take."""
    return math.ceil(math.log2(2 * int(levels) + 1))


def pack_levels(q: np.ndarray, levels: int) -> np.ndarray:
    """Return signed levels ``q`` in -s..s packed as codes q + s, ``qsgd_bits(s)`` bits each (uint8)."""
    bits = qsgd_bits(levels)
    codes = (np.asarray(q, np.int16) + levels).astype(np.uint8)
    fields = np.unpackbits(codes[:, None], axis=1, bitorder="little")[:, :bits]
    return np.packbits(fields.reshape(-1), bitorder="little")


def unpack_levels(packed: np.ndarray, count: int, levels: int) -> np.ndarray:
    """Return the ``count`` signed levels (int8) that :func:`pack_levels` packed into ``packed``."""
    bits = qsgd_bits(levels)
    need = math.ceil(count * bits / 8)
    if packed.dtype != np.uint8 or packed.size != need:
        raise PayloadError(
            f"qsgd payload has {packed.size} {packed.dtype} bytes of levels, {count} values at "
            f"{bits} bits need {need} uint8 (sender and receiver must agree on levels={levels})"
        )
    fields = np.unpackbits(packed, count=count * bits, bitorder="little").reshape(count, bits)
    codes = fields.astype(np.int16) @ (1 << np.arange(bits, dtype=np.int16))
    if codes.size and codes.max() > 2 * levels:
        raise PayloadError(f"qsgd payload holds a code above {2 * levels}: corrupt")
    return (codes - levels).astype(np.int8)


def qsgd_variance_bound(g: Any, levels: int, bucket: int = 512) -> float:
    """Return $\\sum_b \\min(d_b/s^2, \\sqrt{d_b}/s)\\,\\|g_b\\|^2$, Alistarh et al.'s bound per bucket."""
    flat = np.asarray(g, np.float64).reshape(-1)
    total = 0.0
    for start in range(0, flat.size, bucket):
        b = flat[start : start + bucket]
        d = b.size
        total += min(d / levels**2, math.sqrt(d) / levels) * float(b @ b)
    return total


@dataclass(frozen=True)
class QSGDSettings:
    """``levels``: s (1..127); ``bucket``: d, values per norm (default 512); ``seed`` of the rounding."""

    levels: int = 7
    bucket: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.levels, (int, np.integer)) and 1 <= self.levels <= 127):
            raise ValueError(
                f"levels={self.levels!r}: QSGD needs 1..127 levels (ceil(log2(2s+1)) <= 8 bits a "
                "value); s=7 is sign + 3 bits (4 bits a value), s=1 is ternary (2 bits)"
            )
        if not (isinstance(self.bucket, (int, np.integer)) and self.bucket >= 1):
            raise ValueError(
                f"bucket={self.bucket!r}: values per norm must be an integer >= 1 "
                "(Alistarh et al. use 512; one norm per tensor is bucket >= its size)"
            )


class QSGD(Compressor):
    """QSGD: per bucket a norm, per value a sign and a stochastically rounded level; unbiased."""

    name = "qsgd"
    unbiased = True

    def __init__(self, settings: QSGDSettings | None = None, **kwargs: Any) -> None:
        self.settings = settings or QSGDSettings(**kwargs)
        self.reseed(0)

    @property
    def bits(self) -> int:
        """Return the bits one value takes on the wire, $\\lceil \\log_2(2s+1) \\rceil$."""
        return qsgd_bits(self.settings.levels)

    def reseed(self, stream: int) -> None:
        """Restart the random rounding for ``stream`` (the exchange passes the rank)."""
        self.rng = np.random.default_rng([self.settings.seed, stream])

    def levels_of(self, tensor: Any, name: str = "") -> tuple[np.ndarray, np.ndarray]:
        """Return the signed levels (int8, one a value) and the float32 norms (one a bucket)."""
        flat, _, _ = finite_float32(tensor, name, "QSGD")
        s, d = self.settings.levels, self.settings.bucket
        norms = _float32_norms(flat, d, name)
        if not flat.size:
            return np.zeros(0, np.int8), norms
        per_value = np.repeat(norms, d)[: flat.size]
        safe = np.where(per_value > 0, per_value, np.float32(1))
        # |g_i| <= norm of its bucket, so r is in [0, s]; the clip catches a norm rounded down
        r = np.minimum(np.abs(flat) / safe * np.float32(s), np.float32(s))
        low = np.floor(r)
        up = self.rng.random(flat.size, dtype=np.float32) < (r - low)  # P(up) = r - low
        q = (np.sign(flat) * (low + up)).astype(np.int8)
        return q, norms

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Return ``q`` (levels packed ``bits`` a value, uint8) and ``norm`` (float32 per bucket)."""
        _, shape, dtype = as_float32(tensor)
        q, norms = self.levels_of(tensor, name)
        packed = pack_levels(q, self.settings.levels)
        return payload_of(self.name, shape, dtype, q=packed, norm=norms), None

    def decode_levels(self, payload: Payload) -> np.ndarray:
        """Return the signed levels (int8) that ``payload`` carries."""
        return unpack_levels(payload.parts["q"], payload.numel, self.settings.levels)

    def decode_values(self, payload: Payload) -> np.ndarray:
        """Return ``q * norm_b / s``, each value scaled by its bucket's norm."""
        s, d, n = self.settings.levels, self.settings.bucket, payload.numel
        norms = payload.parts["norm"]
        if norms.dtype != np.float32 or norms.size != -(-n // d):
            raise PayloadError(
                f"qsgd payload has {norms.size} {norms.dtype} norms, {n} values in buckets of {d} "
                f"need {-(-n // d)} float32 (sender and receiver must agree on bucket={d})"
            )
        q = self.decode_levels(payload)
        step = (norms / np.float32(s)).astype(np.float32)
        return q.astype(np.float32) * np.repeat(step, d)[:n]


def _float32_norms(flat: np.ndarray, bucket: int, name: str) -> np.ndarray:
    """Return each bucket's $\\|g_b\\|_2$ computed in float64, rounded to float32 as it travels."""
    count = -(-flat.size // bucket)
    wide = np.zeros(count * bucket, np.float64)
    wide[: flat.size] = flat
    rows = wide.reshape(count, bucket)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    if norms.size and norms.max() > _FLOAT32_MAX:
        raise ValueError(
            f"gradient {name or '(unnamed)'} has a bucket norm {norms.max():.3g}, above "
            f"{_FLOAT32_MAX:.3g}, the largest float32 (QSGD sends each norm as one): clip "
            "gradients (torch.nn.utils.clip_grad_norm_) or lower the learning rate"
        )
    return norms.astype(np.float32)


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
        flat, shape, dtype = finite_float32(tensor, name, "sign")
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
