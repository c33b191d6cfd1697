"""Lecture 1: scikit-learn's 8x8 digits: 1 797 images that ship with scikit-learn, so they work offline."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

__all__ = ["DIGITS_NUM_TEST", "DIGITS_SPLIT_SEED", "digits_arrays", "load_digits"]

#: Size of the fixed test split (about one sixth of the set; stratified by class).
DIGITS_NUM_TEST = 297
#: Seed of the fixed train / test split, so every engine and every student gets the same split.
DIGITS_SPLIT_SEED = 0


def digits_arrays(*, train: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Return digits as NumPy ``(X, y)``: X float64 (N, 64) in [0, 1], y int64 (N,)."""
    from sklearn.datasets import load_digits as _sk_load_digits
    from sklearn.model_selection import train_test_split

    bunch = _sk_load_digits()
    X = bunch.data.astype(np.float64) / 16.0  # pixel values are 0..16
    y = bunch.target.astype(np.int64)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=DIGITS_NUM_TEST, random_state=DIGITS_SPLIT_SEED, stratify=y
    )
    return (X_train, y_train) if train else (X_test, y_test)


def load_digits(*, train: bool = True) -> TensorDataset:
    """Return digits as a ``TensorDataset`` of X float32 (N, 1, 8, 8) and y int64 (N,)."""
    X, y = digits_arrays(train=train)
    X = torch.from_numpy(X.astype(np.float32)).reshape(-1, 1, 8, 8)
    return TensorDataset(X, torch.from_numpy(y))
