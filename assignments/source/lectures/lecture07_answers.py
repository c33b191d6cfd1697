"""Instructor answers to lecture 7's exercises (notebooks/07_compression.ipynb)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["my_error_feedback_step", "my_int8_quantize", "my_top_k"]


def my_int8_quantize(g: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """Exercise 7.1: m = max|g| (float32), q = int8(g / m * 127) in float32, zeros when m = 0."""
    m = np.float32(np.abs(g).max()) if g.size else np.float32(0)
    if m == 0:
        return np.zeros(g.shape, np.int8), m
    return (g / m * np.float32(127)).astype(np.int8), m


def my_error_feedback_step(
    g: np.ndarray, residual: np.ndarray, quantize: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Exercise 7.2: compress g + residual; the new residual keeps exactly what was not sent."""
    corrected = g + residual
    sent = quantize(corrected)
    return sent, corrected - sent


def my_top_k(g: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exercise 7.3: the indices and values of the k largest magnitudes."""
    idx = np.argpartition(np.abs(g), g.size - k)[g.size - k :]
    return idx, g[idx]
