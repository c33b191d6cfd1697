"""Checks of assignment A1 (mini-batch SGD and a convolution layer from scratch).

Each check compares the student's NumPy code with torch (autograd, ``F.conv2d``) on fixed
seeds, so its verdict line is the same on every run: the grader compares it with the
instructor's stored PASS line.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.verdict import Verdict, assert_close, run_check

__all__ = ["check_sgd_step", "check_minibatch_sgd", "check_conv2d_layer", "A1_POINTS"]

A1_POINTS = {"A1.1": 2.0, "A1.2": 3.0, "A1.3": 3.0}


def _torch_sgd_step(W, b, X, y, lr):
    Wt = torch.tensor(W, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)
    F.cross_entropy(torch.tensor(X) @ Wt + bt, torch.tensor(y)).backward()
    return (Wt - lr * Wt.grad).detach().numpy(), (bt - lr * bt.grad).detach().numpy()


def _problem(rng: np.random.Generator, n: int, d: int, k: int):
    return (
        rng.normal(size=(d, k)),
        rng.normal(size=k),
        rng.normal(size=(n, d)),
        rng.integers(0, k, n),
    )


def check_sgd_step(sgd_step: Callable, *, verbose: bool = True) -> Verdict:
    """A1.1: ``sgd_step(W, b, X, y, lr) -> (W, b)``: one step on the mean cross-entropy."""

    def body() -> str:
        rng = np.random.default_rng(101)
        shapes = [(1, 3, 2), (8, 5, 4), (64, 64, 10)]
        for n, d, k in shapes:
            W, b, X, y = _problem(rng, n, d, k)
            W_in, b_in = W.copy(), b.copy()
            got_W, got_b = sgd_step(W_in, b_in, X, y, 0.1)
            want_W, want_b = _torch_sgd_step(W, b, X, y, 0.1)
            assert_close(f"W (batch {n})", got_W, want_W)
            assert_close(f"b (batch {n})", got_b, want_b)
        return (
            f"equal to torch autograd + SGD for batches of {', '.join(str(s[0]) for s in shapes)}"
        )

    return run_check("A1.1", "sgd_step", body, max_points=A1_POINTS["A1.1"], verbose=verbose)


def check_minibatch_sgd(minibatch_sgd: Callable, *, verbose: bool = True) -> Verdict:
    """A1.2: ``minibatch_sgd(step, W, b, X, y, lr, batch_size, num_epochs, rng) -> (W, b)``.

    Contract: each epoch draws ``rng.permutation(len(X))`` and calls ``step`` on consecutive
    batches of ``batch_size`` (the last one may be shorter). The check passes torch's step, so
    a wrong A1.1 does not cost A1.2's points.
    """

    def body() -> str:
        cases = [(10, 3, 2), (37, 8, 3), (20, 20, 1)]  # (n, batch_size, num_epochs)
        for n, batch_size, num_epochs in cases:
            W, b, X, y = _problem(np.random.default_rng(n), n, 6, 3)
            got_W, got_b = minibatch_sgd(
                _torch_sgd_step,
                W.copy(),
                b.copy(),
                X,
                y,
                0.05,
                batch_size,
                num_epochs,
                np.random.default_rng(7),
            )
            rng = np.random.default_rng(7)
            for _ in range(num_epochs):
                order = rng.permutation(n)
                for start in range(0, n, batch_size):
                    idx = order[start : start + batch_size]
                    W, b = _torch_sgd_step(W, b, X[idx], y[idx], 0.05)
            assert_close(f"W (n={n}, batch {batch_size})", got_W, W)
            assert_close(f"b (n={n}, batch {batch_size})", got_b, b)
        return f"{len(cases)} runs equal to torch, including a short last batch"

    return run_check("A1.2", "minibatch_sgd", body, max_points=A1_POINTS["A1.2"], verbose=verbose)


def check_conv2d_layer(conv2d_layer: Callable, *, verbose: bool = True) -> Verdict:
    """A1.3: ``conv2d_layer(X, K, bias, stride, padding)`` for X (C_in, H, W), K (C_out, C_in, kh, kw)."""

    def body() -> str:
        rng = np.random.default_rng(303)
        # (c_in, c_out, h, w, kh, kw, stride, padding): non-square images and kernels, so a
        # layer that swaps kh and kw (or h and w) fails; strides 1 to 3, paddings 0 to 2.
        cases = [
            (1, 1, 5, 5, 3, 3, 1, 0),
            (3, 4, 8, 7, 3, 1, 1, 1),
            (2, 3, 9, 10, 2, 3, 2, 0),
            (2, 2, 7, 6, 1, 3, 2, 2),
            (1, 2, 11, 9, 4, 2, 3, 1),
        ]
        for c_in, c_out, h, w, kh, kw, stride, padding in cases:
            X = rng.normal(size=(c_in, h, w))
            K = rng.normal(size=(c_out, c_in, kh, kw))
            bias = rng.normal(size=c_out)
            want = F.conv2d(
                torch.tensor(X)[None], torch.tensor(K), torch.tensor(bias), stride, padding
            )[0].numpy()
            try:
                got = conv2d_layer(X.copy(), K.copy(), bias.copy(), stride, padding)
            except (ValueError, IndexError) as exc:  # e.g. kh and kw swapped: shapes disagree
                raise AssertionError(
                    f"{kh}x{kw} kernel, stride {stride}, padding {padding}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            assert_close(
                f"output ({kh}x{kw} kernel, stride {stride}, padding {padding})", got, want
            )
        return (
            f"equal to torch's conv2d in {len(cases)} cases of channels, non-square kernels, "
            "stride and padding"
        )

    return run_check("A1.3", "conv2d_layer", body, max_points=A1_POINTS["A1.3"], verbose=verbose)
