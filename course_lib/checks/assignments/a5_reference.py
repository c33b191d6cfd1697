"""The reference of assignment A5's formats: block-wise int8 max-abs and block top-k.

Source 000's int8 with one scale per block of ``block`` consecutive values, and top-k kept in
every block: the functions here are what A5's checks compare the student's with, bit for bit
(float32 arithmetic, the cast to int8 truncating toward zero, decoding *multiplies* by the
scale: source 000's text says "divide", which is wrong), the payload sizes, and the same formats
as :class:`~course_lib.compression.base.Compressor` objects for the exchange's checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_lib.compression.base import Compressor, Payload

__all__ = [
    "ReferenceBlockInt8",
    "ReferenceBlockTopK",
    "block_int8_bytes",
    "block_topk_bytes",
    "blocks",
    "reference_decode",
    "reference_encode",
    "reference_topk",
]


def blocks(n: int, block: int) -> list[tuple[int, int]]:
    """Return the ``(start, stop)`` of every block of ``block`` values in ``n`` (the last may be short)."""
    return [(start, min(start + block, n)) for start in range(0, n, block)]


def reference_encode(g: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(q, scales)``: per block ``m = max|g|``, ``q = int8(g / m * 127)`` in float32."""
    g = np.asarray(g, np.float32).reshape(-1)
    q = np.zeros(g.size, np.int8)
    scales = np.zeros(len(blocks(g.size, block)), np.float32)
    for b, (lo, hi) in enumerate(blocks(g.size, block)):
        scales[b] = m = np.abs(g[lo:hi]).max()
        if m > 0:  # the cast truncates toward zero, as source 000's float32 -> int8 does
            q[lo:hi] = (g[lo:hi] / m * np.float32(127)).astype(np.int8)
    return q, scales


def reference_decode(q: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """Return ``q / 127 * m`` (float32), ``m`` the scale of each value's block."""
    per_value = np.repeat(np.asarray(scales, np.float32), block)[: q.size]
    return q.astype(np.float32) / np.float32(127) * per_value  # multiply: the inverse of g / m


def reference_topk(g: np.ndarray, block: int, k: int) -> np.ndarray:
    """Return the ascending indices of the ``k`` largest ``|g|`` of every block (ties: lower index)."""
    g = np.asarray(g, np.float32).reshape(-1)
    kept = [
        lo + np.sort(np.argsort(-np.abs(g[lo:hi]), kind="stable")[:k])
        for lo, hi in blocks(g.size, block)
    ]
    return np.concatenate(kept).astype(np.int64) if kept else np.zeros(0, np.int64)


def block_int8_bytes(n: int, block: int) -> int:
    """Return the payload bytes of block int8: one byte a value, one float32 scale a block."""
    return n + 4 * len(blocks(n, block))


def block_topk_bytes(n: int, block: int, k: int) -> int:
    """Return the payload bytes of block top-k: a uint32 index and a float32 value per kept value."""
    return 8 * sum(min(k, hi - lo) for lo, hi in blocks(n, block))


class ReferenceBlockInt8(Compressor):
    """Block int8 max-abs as a compressor: :func:`reference_encode`, :func:`reference_decode`."""

    name = "ref_block_int8"

    def __init__(self, block: int) -> None:
        self.block = block

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        g = np.asarray(tensor, np.float32).reshape(-1)
        q, scales = reference_encode(g, self.block)
        return Payload(self.name, (g.size,), "float32", {"q": q, "scales": scales}), None

    def decode_values(self, payload: Payload) -> np.ndarray:
        return reference_decode(payload.parts["q"], payload.parts["scales"], self.block)


class ReferenceBlockTopK(Compressor):
    """Block top-k as a compressor: :func:`reference_topk`, a uint32 index and a value each."""

    name = "ref_block_topk"

    def __init__(self, block: int, k: int) -> None:
        self.block, self.k = block, k

    def compress(self, tensor: Any, name: str = "") -> tuple[Payload, Any]:
        g = np.asarray(tensor, np.float32).reshape(-1)
        idx = reference_topk(g, self.block, self.k)
        parts = {"indices": idx.astype(np.uint32), "values": g[idx]}
        return Payload(self.name, (g.size,), "float32", parts), None

    def decode_values(self, payload: Payload) -> np.ndarray:
        out = np.zeros(payload.numel, np.float32)
        out[payload.parts["indices"]] = payload.parts["values"]
        return out
