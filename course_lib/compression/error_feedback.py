"""Error feedback: remember what compression dropped and add it to the next gradient.

1-bit SGD (Seide et al. 2014) and EF-SGD (Karimireddy et al. 2019): each rank keeps, per tensor
name, the residual $e$; it compresses $p = g + e$ instead of $g$, and keeps $e \\leftarrow p -
\\mathrm{decompress}(\\mathrm{compress}(p))$. Nothing is lost, only delayed: after T steps,
(sum of what was sent) + (residual) = (sum of the gradients). This is the fix source 000 pointed
to when int8 hurt their accuracy, and what lets top-k and sign converge like plain SGD.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_lib.compression.base import Compressor, Payload, as_float32

__all__ = ["ErrorFeedback"]


class ErrorFeedback(Compressor):
    """Wrap ``compressor``: compress gradient + residual, keep the new residual per tensor name.

    The residual lives on this rank only and is never sent. ``decompress`` is the wrapped
    compressor's, so payloads of ranks with and without error feedback decode alike.
    """

    def __init__(self, compressor: Compressor) -> None:
        if isinstance(compressor, ErrorFeedback):
            raise ValueError("this compressor already has error feedback; wrap it only once")
        self.compressor = compressor
        self.residuals: dict[str, np.ndarray] = {}

    @property
    def name(self) -> str:  # type: ignore[override]
        """Return the wrapped compressor's name (payloads carry it)."""
        return self.compressor.name

    @property
    def summable(self) -> bool:  # type: ignore[override]
        """Return whether the wrapped compressor's payloads add up elementwise."""
        return self.compressor.summable

    @property
    def settings(self) -> Any:
        """Return the wrapped compressor's settings."""
        return getattr(self.compressor, "settings", None)

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Compress ``tensor`` + this name's residual; keep what the payload does not carry."""
        flat, shape, dtype = as_float32(tensor)
        residual = self.residuals.get(name)
        if residual is not None and residual.size != flat.size:
            raise ValueError(
                f"tensor {name!r} has {flat.size} values but its residual {residual.size}: "
                "give each tensor its own name, or call reset() after changing the model"
            )
        corrected = flat + residual if residual is not None else flat.copy()
        payload, ctx = self.compressor.compress(corrected.reshape(shape), name)
        sent = self.compressor.decode_values(payload)
        self.residuals[name] = corrected - sent  # what was dropped is sent in later steps
        payload.dtype = dtype
        return payload, ctx

    def decode_values(self, payload: Payload) -> np.ndarray:
        """Return the wrapped compressor's decoding of ``payload``."""
        return self.compressor.decode_values(payload)

    def prescale(self, payload: Payload, world_size: int) -> None:
        """Divide a summable payload in place (the residual was kept before the division)."""
        self.compressor.prescale(payload, world_size)

    def reseed(self, stream: int) -> None:
        """Pass ``reseed`` on to a stochastic compressor."""
        if hasattr(self.compressor, "reseed"):
            self.compressor.reseed(stream)

    def reset(self) -> None:
        """Forget every residual (after the model or its parameters changed)."""
        self.residuals.clear()

    def __repr__(self) -> str:
        return f"<ErrorFeedback around {self.compressor!r}, {len(self.residuals)} residuals>"
