"""From-scratch NumPy versions of what torch does for us: SGD on softmax regression, conv, pooling.

Lectures 1 and 2 build these step by step and compare them with torch. Each naive version
(loops, as the formula reads) sits next to a vectorised one with the same result; the naive ones
are for reading, not for use: Python loops run about a thousand times slower.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = [
    "softmax",
    "softmax_regression_loss",
    "softmax_regression_grad",
    "minibatches",
    "sgd_epoch",
    "train_softmax_regression",
    "corr2d",
    "conv2d_naive",
    "conv2d",
    "max_pool2d_naive",
    "max_pool2d",
]


# ---- Lecture 1: gradient descent, SGD and mini-batch SGD on softmax regression --------------


def softmax(Z: np.ndarray) -> np.ndarray:
    """Return row-wise softmax of logits Z (N, K), shifted by the row max for stability."""
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def softmax_regression_loss(W: np.ndarray, b: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """Return mean cross-entropy of logits X @ W + b against labels y (inf once a run diverged)."""
    P = softmax(X @ W + b)
    with np.errstate(divide="ignore"):  # a probability that underflowed to 0 costs inf, silently
        return float(-np.log(P[np.arange(len(y)), y]).mean())


def softmax_regression_grad(
    W: np.ndarray, b: np.ndarray, X: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return (dW, db), the gradient of the mean cross-entropy.

    With P = softmax(X W + b) and Y the one-hot labels, dL/dZ = (P - Y) / N, so
    $dW = X^T (P - Y) / N$ and $db = \\sum_n (P - Y)_n / N$ (source 001: dE/dw_ij = x_i dE/dz_j).
    """
    G = softmax(X @ W + b)
    G[np.arange(len(y)), y] -= 1.0
    G /= len(y)
    return X.T @ G, G.sum(axis=0)


def minibatches(
    num_samples: int, batch_size: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """Yield index arrays of one epoch: a fresh permutation cut into batches (last may be short).

    batch_size = num_samples is (full-batch) gradient descent, batch_size = 1 is SGD.
    """
    order = rng.permutation(num_samples)
    for start in range(0, num_samples, batch_size):
        yield order[start : start + batch_size]


def sgd_epoch(
    W: np.ndarray,
    b: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    lr: float,
    batches: list[np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Return new (W, b) after one SGD step per index batch: w <- w - lr * grad (source 001).

    The inputs are not modified.
    """
    W, b = W.copy(), b.copy()
    for idx in batches:
        dW, db = softmax_regression_grad(W, b, X[idx], y[idx])
        W -= lr * dW
        b -= lr * db
    return W, b


def train_softmax_regression(
    X: np.ndarray,
    y: np.ndarray,
    *,
    lr: float,
    batch_size: int,
    num_epochs: int,
    seed: int = 0,
    num_classes: int = 10,
) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Train softmax regression from zeros; return (W, b, loss on all of X after each epoch)."""
    rng = np.random.default_rng(seed)
    W, b = np.zeros((X.shape[1], num_classes)), np.zeros(num_classes)
    losses = []
    for _ in range(num_epochs):
        W, b = sgd_epoch(W, b, X, y, lr, list(minibatches(len(X), batch_size, rng)))
        losses.append(softmax_regression_loss(W, b, X, y))
    return W, b, losses


# ---- Lecture 2: convolution and max pooling -----------------------------------------------


def corr2d(X: np.ndarray, K: np.ndarray, stride: int = 1) -> np.ndarray:
    """Slide kernel K (kh, kw) over matrix X (h, w) and take dot products (no padding).

    This is source 001's "convolution of A with kernel B"; deep learning frameworks compute
    exactly this cross-correlation (the kernel is not flipped) and call it convolution.
    """
    kh, kw = K.shape
    out_h, out_w = (X.shape[0] - kh) // stride + 1, (X.shape[1] - kw) // stride + 1
    Y = np.zeros((out_h, out_w), dtype=np.result_type(X, K))
    for i in range(out_h):
        for j in range(out_w):
            Y[i, j] = (X[i * stride : i * stride + kh, j * stride : j * stride + kw] * K).sum()
    return Y


def _pad(X: np.ndarray, padding: int) -> np.ndarray:
    """Return X (N, C, H, W) with ``padding`` zeros around each image."""
    return np.pad(X, ((0, 0), (0, 0), (padding, padding), (padding, padding)))


def conv2d_naive(
    X: np.ndarray, W: np.ndarray, b: np.ndarray | None = None, stride: int = 1, padding: int = 0
) -> np.ndarray:
    """Return conv of X (N, C, H, W) with W (O, C, kh, kw): a ``corr2d`` per (image, out, in)."""
    X = _pad(X, padding)
    num_images, num_out = X.shape[0], W.shape[0]
    first = corr2d(X[0, 0], W[0, 0], stride)
    Y = np.zeros((num_images, num_out, *first.shape), dtype=np.result_type(X, W))
    for n in range(num_images):
        for o in range(num_out):
            for c in range(X.shape[1]):
                Y[n, o] += corr2d(X[n, c], W[o, c], stride)
            if b is not None:
                Y[n, o] += b[o]
    return Y


def conv2d(
    X: np.ndarray, W: np.ndarray, b: np.ndarray | None = None, stride: int = 1, padding: int = 0
) -> np.ndarray:
    """Return the same as :func:`conv2d_naive`, vectorised: all windows at once, one tensordot."""
    kh, kw = W.shape[2:]
    # windows: (N, C, out_h, out_w, kh, kw), a view of X, no copy.
    windows = sliding_window_view(_pad(X, padding), (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    Y = np.tensordot(windows, W, axes=([1, 4, 5], [1, 2, 3]))  # (N, out_h, out_w, O)
    if b is not None:
        Y = Y + b
    return Y.transpose(0, 3, 1, 2)


def max_pool2d_naive(X: np.ndarray, size: int = 2, stride: int | None = None) -> np.ndarray:
    """Return the max of each size x size block of X (N, C, H, W), block by block (source 001)."""
    stride = stride or size
    N, C, H, W = X.shape
    out_h, out_w = (H - size) // stride + 1, (W - size) // stride + 1
    Y = np.empty((N, C, out_h, out_w), dtype=X.dtype)
    for i in range(out_h):
        for j in range(out_w):
            block = X[:, :, i * stride : i * stride + size, j * stride : j * stride + size]
            Y[:, :, i, j] = block.max(axis=(2, 3))
    return Y


def max_pool2d(X: np.ndarray, size: int = 2, stride: int | None = None) -> np.ndarray:
    """Return the same as :func:`max_pool2d_naive`, vectorised over all windows."""
    stride = stride or size
    windows = sliding_window_view(X, (size, size), axis=(2, 3))[:, :, ::stride, ::stride]
    return windows.max(axis=(4, 5))
