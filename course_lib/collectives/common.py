"""Lecture 3: What every from-scratch collective shares: flat views, elementwise reduction, message tags."""

from __future__ import annotations

import numpy as np

from course_lib.comm.buffers import REDUCE_OPS, Buffer, as_flat_array, numpy_reducible

__all__ = ["TAGS", "reduce_into", "reducible_flat"]

# One tag per algorithm, so two different collectives in flight never take each other's messages.
TAGS = {
    "star": 8100, "naive": 8101, "ring_rs": 8102, "ring_ag": 8103, "doubling": 8104,
    "bcast": 8105, "bcast_naive": 8106, "gossip": 8107, "ping": 8108,
    "gossip_sparse": 8110,  # and 8111, 8112: count, indices, values
    "all_to_all": 8113, "all_to_all_counts": 8114,
}  # fmt: skip

_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def reducible_flat(tensor: Buffer, op: str, bfloat16_ok: bool = False) -> np.ndarray:
    """Return a flat NumPy view of ``tensor`` after checking that ``op`` can reduce it.

    ``bfloat16_ok``: the caller reduces a bfloat16 tensor's bits with ``reduce_into(bfloat16=True)``.
    """
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
    if not bfloat16_ok:
        numpy_reducible(tensor)
    return as_flat_array(tensor)


def reduce_into(
    out: np.ndarray, other: np.ndarray, op: str = "sum", bfloat16: bool = False
) -> None:
    """Combine ``other`` into ``out`` elementwise, in place (``out = out (op) other``).

    ``bfloat16``: the arrays are bfloat16's bits seen as int16 (NumPy has no bfloat16): each
    value is widened to float32, combined, and rounded back to nearest even, as torch's
    bfloat16 arithmetic does (NumPy only: this runs on communication threads too).
    """
    if bfloat16:
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN, as in torch
            result = _UFUNCS[op](_widen(out), _widen(other))
        out[...] = _round_to_bfloat16(result)
        return
    _UFUNCS[op](out, other, out=out)


def _widen(bits: np.ndarray) -> np.ndarray:
    """Return the float32 values of bfloat16 ``bits`` (int16): the bits are float32's top half."""
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """Return float32 ``x`` rounded to the nearest bfloat16 (ties to even), as int16 bits."""
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)  # stays a NaN
    return rounded.view(np.int16)
