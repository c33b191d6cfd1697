"""Lecture 7: The compressor interface: what is sent (a payload), what stays (a context), how to undo it.

A compressor turns one gradient tensor into a :class:`Payload` (NumPy arrays that travel, plus
the original shape and dtype) and a local context that never leaves the rank, and turns a
payload back into an array of the original shape and dtype. One property tells the exchange how
payloads may travel: ``summable`` payloads add up elementwise (float16 values), so an allreduce
can carry them; all the others (one scale per rank, indices that differ between ranks) must be
gathered and decoded one by one. The three roles follow GRACE (Xu et al. 2021): compressor,
memory (:mod:`~course_lib.compression.error_feedback`) and communicator (the exchange).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from course_lib.comm.by_value import ByValue

__all__ = [
    "FLOAT_DTYPES",
    "Compressor",
    "Payload",
    "PayloadError",
    "as_float32",
    "finite_float32",
    "mean_in_rank_order",
]

#: The dtypes a gradient may have; the decompressed array comes back in the same one.
FLOAT_DTYPES = ("float16", "float32", "float64")


class PayloadError(ValueError):
    """A payload is corrupt, truncated or not what the receiver expected; the message says which."""


@dataclass
class Payload:
    """What one compressed tensor sends: the compressor's name, the original shape and dtype, parts.

    ``parts`` maps a part name (``"values"``, ``"indices"``, ``"scale"``, ...) to a flat NumPy
    array; the wire format (:mod:`~course_lib.compression.wire`) carries them with a header.
    """

    kind: str
    shape: tuple[int, ...]
    dtype: str
    parts: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        """Return the number of elements of the original tensor."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Return the bytes of all parts (what travels, before any lossless coding and header)."""
        return int(sum(p.nbytes for p in self.parts.values()))


def as_float32(tensor: Any) -> tuple[np.ndarray, tuple[int, ...], str]:
    """Return ``(flat float32 copy-or-view, shape, dtype name)`` of a torch tensor or NumPy array."""
    if type(tensor).__module__.startswith("torch"):
        tensor = tensor.detach().cpu()
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in FLOAT_DTYPES:
            raise TypeError(f"cannot compress a {name} tensor: convert it with .float() first")
        tensor = tensor.numpy()
    if not isinstance(tensor, np.ndarray):
        raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(tensor).__name__}")
    name = str(tensor.dtype)
    if name not in FLOAT_DTYPES:
        raise TypeError(f"cannot compress a {name} array: gradients are {', '.join(FLOAT_DTYPES)}")
    flat = np.ascontiguousarray(tensor, dtype=np.float32).reshape(-1)
    return flat, tuple(int(s) for s in tensor.shape), name


class Compressor(ByValue, ABC):
    """Base class: ``compress(tensor, name) -> (payload, ctx)``; ``decompress(payload, ctx)``.

    Subclasses set ``name``, ``summable`` (payloads add up elementwise: allreduce can carry them)
    and ``unbiased`` (the mean of ``decompress(compress(g))`` over the compressor's randomness is
    ``g``; biased compressors need error feedback to converge, Karimireddy et al. 2019).
    """

    name: ClassVar[str] = "abstract"
    summable: ClassVar[bool] = False
    unbiased: ClassVar[bool] = False

    @abstractmethod
    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        """Return the payload to send for ``tensor`` and a context that stays on this rank."""

    @abstractmethod
    def decode_values(self, payload: Payload) -> np.ndarray:
        """Return the flat float32 values that ``payload`` stands for."""

    def decompress(self, payload: Payload, ctx: Any = None) -> np.ndarray:
        """Return an array of the original shape and dtype; ``ctx`` may be None for others' payloads."""
        if payload.kind != self.name:
            raise PayloadError(f"a {payload.kind!r} payload given to the {self.name!r} compressor")
        try:
            flat = self.decode_values(payload)
        except KeyError as exc:
            raise PayloadError(f"{self.name} payload lacks its part {exc}") from None
        if flat.size != payload.numel:
            raise PayloadError(
                f"{self.name} payload decodes to {flat.size} values, its shape {payload.shape} "
                f"needs {payload.numel}"
            )
        return flat.astype(payload.dtype, copy=False).reshape(payload.shape)

    def prescale(self, payload: Payload, world_size: int) -> None:
        """Divide a summable payload by ``world_size`` in its own dtype, in place (see subclasses)."""
        raise TypeError(f"{self.name} payloads cannot be summed: gather them instead")

    def __repr__(self) -> str:
        settings = getattr(self, "settings", None)
        return f"<{type(self).__name__} {self.name!r} {settings if settings is not None else ''}>"


def payload_of(kind: str, shape: tuple[int, ...], dtype: str, **parts: np.ndarray) -> Payload:
    """Return a :class:`Payload` whose parts are flat contiguous arrays."""
    flat = {k: np.ascontiguousarray(v).reshape(-1) for k, v in parts.items()}
    return Payload(kind, shape, dtype, flat)


def check_finite(flat: np.ndarray, name: str, kind: str) -> None:
    """Raise ValueError naming ``name`` when ``flat`` holds inf or NaN (no scale can encode them)."""
    if flat.size and not np.isfinite(flat).all():
        bad = int(np.size(flat) - np.isfinite(flat).sum())
        raise ValueError(
            f"gradient {name or '(unnamed)'} holds {bad} inf/NaN values; {kind} cannot encode them. "
            "Lower the learning rate or clip gradients (torch.nn.utils.clip_grad_norm_)"
        )


def finite_float32(tensor: Any, name: str, kind: str) -> tuple[np.ndarray, tuple[int, ...], str]:
    """Return :func:`as_float32` of ``tensor``; raise ValueError when it holds inf or NaN."""
    flat, shape, dtype = as_float32(tensor)
    check_finite(flat, name, kind)
    return flat, shape, dtype


def mean_in_rank_order(arrays: list[np.ndarray]) -> np.ndarray:
    """Return the float32 mean of ``arrays``, summed in list (rank) order, then divided.

    Floating-point addition is not associative: every rank that sums the same arrays in the
    same order gets the same bits, which keeps data-parallel replicas equal.
    """
    total = np.array(arrays[0], dtype=np.float32, copy=True).reshape(-1)
    for a in arrays[1:]:
        total += a.reshape(-1)
    total /= np.float32(len(arrays))
    return total
