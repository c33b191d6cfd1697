"""Lecture 7: Error feedback: remember what compression dropped and add it to the next gradient.

1-bit SGD (Seide et al. 2014) and EF-SGD (Karimireddy et al. 2019): each rank keeps, per tensor
name, the residual $e$; it compresses $p = g + e$ instead of $g$, and keeps $e \\leftarrow p -
\\mathrm{decompress}(\\mathrm{compress}(p))$. Nothing is lost, only delayed: after T steps,
(sum of what was sent) + (residual) = (sum of the gradients). This is the fix source 000 pointed
to when int8 hurt their accuracy, and what lets top-k and sign converge like plain SGD.

With momentum SGD, error feedback on the gradient is not enough: the optimiser's momentum then
acts on the delayed, bursty sum it receives, not on the gradients. Deep Gradient Compression (Lin
et al. 2018, section 3.2) moves the momentum before the compressor (*momentum correction*): each
rank keeps a velocity $u \\leftarrow \\mu u + g$ and accumulates $e \\leftarrow e + u$; it sends
$C(e)$ and keeps $e - C(e)$; the receivers apply plain SGD (no momentum) to the mean. With no
compression this is momentum SGD exactly (what is sent each step is $u$). For sparsifiers, DGC
adds *momentum factor masking* (``masking=True``): $u$ is cleared where values were sent, so
stale momentum does not push them again. Use ``ErrorFeedback(c, momentum=0.9)`` with an
optimiser without momentum (``TrainConfig(momentum=0)``): the momentum is applied here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_lib.compression.base import Compressor, Payload, as_float32

__all__ = ["ErrorFeedback"]


class ErrorFeedback(Compressor):
    """Wrap ``compressor``: compress gradient + residual, keep the new residual per tensor name.

    ``momentum`` > 0 turns on DGC's momentum correction (velocity per name, accumulated in
    the residual); ``masking`` clears the velocity of values sent (DGC, for sparsifiers).

    The residual lives on this rank only and is never sent. ``decompress`` is the wrapped
    compressor's, so payloads of ranks with and without error feedback decode alike.
    """

    def __init__(
        self, compressor: Compressor, momentum: float = 0.0, masking: bool = False
    ) -> None:
        if isinstance(compressor, ErrorFeedback):
            raise ValueError("this compressor already has error feedback; wrap it only once")
        if not (isinstance(momentum, (int, float)) and 0 <= momentum < 1):
            raise ValueError(
                f"momentum={momentum!r}: DGC's momentum correction takes the SGD momentum in "
                "[0, 1), e.g. 0.9 (then train with momentum=0: it is applied here); 0 turns it off"
            )
        self.compressor = compressor
        self.momentum, self.masking = float(momentum), bool(masking)
        self.residuals: dict[str, np.ndarray] = {}
        self.velocities: dict[str, np.ndarray] = {}

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
        if self.momentum:  # DGC momentum correction: accumulate the velocity, not the gradient
            velocity = self.velocities.get(name)
            flat = flat.copy() if velocity is None else np.float32(self.momentum) * velocity + flat
            self.velocities[name] = flat
        corrected = flat + residual if residual is not None else flat.copy()
        payload, ctx = self.compressor.compress(corrected.reshape(shape), name)
        sent = self.compressor.decode_values(payload)
        self.residuals[name] = corrected - sent  # what was dropped is sent in later steps
        if self.momentum and self.masking:  # DGC momentum factor masking: sent values restart
            self.velocities[name][sent != 0] = 0.0
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
        """Forget every residual and velocity (after the model or its parameters changed)."""
        self.residuals.clear()
        self.velocities.clear()

    def __repr__(self) -> str:
        dgc = f", momentum correction {self.momentum:g}" if self.momentum else ""
        return f"<ErrorFeedback around {self.compressor!r}{dgc}, {len(self.residuals)} residuals>"
