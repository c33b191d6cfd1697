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


def reducible_flat(tensor: Buffer, op: str) -> np.ndarray:
    """Return a flat NumPy view of ``tensor`` after checking that ``op`` can reduce it."""
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
    numpy_reducible(tensor)
    return as_flat_array(tensor)


def reduce_into(out: np.ndarray, other: np.ndarray, op: str = "sum") -> None:
    """Combine ``other`` into ``out`` elementwise, in place (``out = out (op) other``)."""
    _UFUNCS[op](out, other, out=out)
