"""Lecture 7: Source 000's int8 max-abs quantisation, exactly as they define it, and its error bound.

Encode: find $m = \\max_i |g_i|$; $g / m \\in [-1, 1]$; $\\times 127 \\in [-127, 127]$; cast
float32 -> int8. The cast truncates toward zero (PyTorch's ``.to(torch.int8)`` and NumPy's
``astype`` both do), so every value loses less than one step $m / 127$. Decode: the inverse
operations in reverse order, $q / 127 \\times m$.

The source's text says the decoder *divides* by the maximum. That is wrong: the inverse of
dividing by $m$ is multiplying by it. Dividing would return $g / m^2$, which for the usual
$m < 1$ *inflates* every gradient (a maximum of 0.075 makes it 178 times too large). Here the
decoder multiplies.

``m`` is taken over whatever one call receives: the exchange's ``granularity="flat"`` passes the
whole flattened gradient (one global scale, as the source did), ``"tensor"`` each parameter
(one scale per tensor, which suits layers whose gradients differ in size by orders of magnitude).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from course_lib.compression.base import Compressor, Payload, as_float32, payload_of

__all__ = ["Int8MaxAbs", "Int8Settings", "int8_decode", "int8_encode"]


@dataclass(frozen=True)
class Int8Settings:
    """``rounding``: ``"truncate"`` (the source's cast) or ``"nearest"`` (half the error)."""

    rounding: str = "truncate"

    def __post_init__(self) -> None:
        if self.rounding not in ("truncate", "nearest"):
            raise ValueError(
                f"rounding={self.rounding!r}: use 'truncate' (source 000's cast to int8, error < "
                "max/127) or 'nearest' (np.rint first, error <= max/254)"
            )


def int8_encode(flat: np.ndarray, rounding: str = "truncate") -> tuple[np.ndarray, np.float32]:
    """Return ``(q, m)``: ``q = int8(g / m * 127)`` (float32 arithmetic) and ``m = max |g|``."""
    # max(max g, -min g) is max |g| without a temporary array (half the time of abs().max()).
    m = np.float32(max(flat.max(), -flat.min())) if flat.size else np.float32(0)
    if not np.isfinite(m):
        raise ValueError(
            "the gradient holds inf or NaN values; int8 max-abs cannot encode them. "
            "Lower the learning rate or clip gradients (torch.nn.utils.clip_grad_norm_)"
        )
    if m == 0:
        return np.zeros(flat.size, np.int8), m
    scaled = flat / m * np.float32(127)  # g / max -> [-1, 1]; x 127 -> [-127, 127]
    if rounding == "nearest":
        scaled = np.rint(scaled)
    return scaled.astype(np.int8), m  # the cast truncates toward zero, like the source's


def int8_decode(q: np.ndarray, m: np.float32) -> np.ndarray:
    """Return ``q / 127 * m`` in float32: the encoding's steps undone in reverse order."""
    # Multiply by the maximum: the source's text says "divide", which would not invert g / m.
    return q.astype(np.float32) / np.float32(127) * np.float32(m)


class Int8MaxAbs(Compressor):
    """int8 max-abs (source 000): 1 byte a value plus one float32 scale; error below max/127."""

    name = "int8"

    def __init__(self, settings: Int8Settings | None = None, **kwargs: Any) -> None:
        self.settings = settings or Int8Settings(**kwargs)

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Return ``q`` (int8) and ``scale`` (``m``, float32) for ``tensor``."""
        flat, shape, dtype = as_float32(tensor)
        try:  # the maximum is inf or NaN exactly when a value is: no separate pass to check
            q, m = int8_encode(flat, self.settings.rounding)
        except ValueError as exc:
            raise ValueError(f"gradient {name or '(unnamed)'}: {exc}") from None
        return payload_of(self.name, shape, dtype, q=q, scale=np.array([m], np.float32)), None

    def decode_values(self, payload: Payload) -> np.ndarray:
        """Return ``q / 127 * m``."""
        return int8_decode(payload.parts["q"], payload.parts["scale"][0])
