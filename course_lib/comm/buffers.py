"""Lecture 3: Turn torch tensors and NumPy arrays into flat byte-level buffers, and describe them in a header."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "DTYPE_NAMES",
    "REDUCE_OPS",
    "Buffer",
    "as_flat_array",
    "chunk_bounds",
    "dtype_name",
    "like",
    "numpy_reducible",
]

Buffer = Any  # a torch.Tensor or a numpy.ndarray; kept loose so NumPy-only engines need no torch

# Index = the code sent in a message header, so both ends agree on the element type.
DTYPE_NAMES: tuple[str, ...] = (
    "float16", "float32", "float64", "bfloat16", "int8", "uint8", "int16", "int32", "int64",
    "bool", "complex64", "complex128",
)  # fmt: skip
REDUCE_OPS: tuple[str, ...] = ("sum", "max", "min")


def _is_torch(x: Buffer) -> bool:
    return type(x).__module__.startswith("torch")


def dtype_name(x: Buffer) -> str:
    """Return the element type of ``x`` as a plain name such as ``"float32"``."""
    name = str(x.dtype).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise TypeError(f"dtype {x.dtype} cannot travel between engines; use one of {DTYPE_NAMES}")
    return name


def as_flat_array(x: Buffer) -> np.ndarray:
    """Return a flat NumPy view of ``x`` that shares its memory (no copy, never pickled)."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"tensor is on {x.device}; move it to the CPU with .cpu() first")
        if not x.is_contiguous():
            raise ValueError("tensor is not contiguous; call .contiguous() before sending it")
        import torch

        if x.dtype == torch.bfloat16:  # NumPy has no bfloat16: move its bits as int16
            x = x.view(torch.int16)
        return x.detach().reshape(-1).numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if not x.flags.c_contiguous:
        raise ValueError("array is not C-contiguous; use np.ascontiguousarray(x) first")
    return x.reshape(-1)


def like(template: Buffer, arr: np.ndarray) -> Buffer:
    """Return ``arr`` as the same kind of object as ``template`` (torch tensor or NumPy array)."""
    if _is_torch(template):
        import torch

        out = torch.from_numpy(arr)
        return out.view(torch.bfloat16) if template.dtype == torch.bfloat16 else out
    return arr


def numpy_reducible(x: Buffer) -> None:
    """Raise TypeError unless a from-scratch collective can add ``x`` elementwise with NumPy."""
    name = dtype_name(x)
    if name in ("bool", "bfloat16"):
        raise TypeError(
            f"from-scratch collectives cannot reduce {name}; convert with .float() first"
        )


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``world_size`` contiguous chunks, the first ones one longer.

    Same layout as ``numpy.array_split``: chunk ``i`` has ``numel // P + (i < numel % P)``
    elements, so lengths not divisible by the world size (and empty buffers) work.
    """
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for i in range(world_size):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
