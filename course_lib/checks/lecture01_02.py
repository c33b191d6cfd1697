"""Check functions for the exercises of lectures 1 and 2; each prints and returns a verdict line.

A check runs the student's function on fresh random inputs and compares it with an independent
reference (torch's autograd and operators where there is one). It never raises: a stub, a wrong
answer or a crash all become ``FAIL (reason)`` (see :func:`course_lib.checks.verdict.run_check`).
While the student's function runs, the ``scratch`` functions that answer the exercise refuse to
run (:func:`course_lib.checks.verdict.refusing`): the lecture imports ``scratch`` to teach from it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks.verdict import Verdict, assert_close, refusing, run_check
from course_lib.i18n import N_, _
from course_lib.training import scratch
from course_lib.training.loop import segmentation_scores

__all__ = [
    "REFUSED",
    "check_softmax_grad",
    "check_sgd_epoch",
    "check_corr2d",
    "check_max_pool2d",
    "check_miou",
]


SCRATCH = "course_lib.training.scratch"
REFUSED = {  # exercise -> the library functions that answer it, and what to write instead
    "1.1": {
        f"{SCRATCH}.softmax_regression_grad": N_(
            "write P = softmax(XW + b) and (P - Y)/N with NumPy"
        )
    },
    "1.2": {
        f"{SCRATCH}.sgd_epoch": N_("loop over the batches: one step w <- w - lr * grad per batch"),
        f"{SCRATCH}.train_softmax_regression": N_("loop over the batches yourself"),
    },
    "2.1": {
        f"{SCRATCH}.corr2d": N_("slide K over X with two loops over the output positions"),
        f"{SCRATCH}.conv2d_naive": N_("slide K over X with two loops over the output positions"),
        f"{SCRATCH}.conv2d": N_("slide K over X with two loops over the output positions"),
    },
    "2.2": {
        f"{SCRATCH}.max_pool2d": N_("take the max of each size x size block (loops, or a reshape)"),
        f"{SCRATCH}.max_pool2d_naive": N_("take the max of each size x size block"),
    },
    "2.3": {
        "course_lib.training.loop.segmentation_scores": N_(
            "count each class's intersection and union with NumPy"
        ),
    },
}


def check_softmax_grad(softmax_grad: Callable, *, verbose: bool = True) -> Verdict:
    """Check Exercise 1.1: ``softmax_grad(W, b, X, y) -> (dW, db)`` against torch autograd."""

    def body() -> str:
        rng = np.random.default_rng(11)
        for n, d, k in [(5, 3, 4), (32, 64, 10)]:
            W, b = rng.normal(size=(d, k)), rng.normal(size=k)
            X, y = rng.normal(size=(n, d)), rng.integers(0, k, size=n)
            Wt = torch.tensor(W, requires_grad=True)
            bt = torch.tensor(b, requires_grad=True)
            F.cross_entropy(torch.tensor(X) @ Wt + bt, torch.tensor(y)).backward()
            with refusing(REFUSED["1.1"]):
                dW, db = softmax_grad(W.copy(), b.copy(), X.copy(), y.copy())
            assert_close("dW", dW, Wt.grad.numpy())
            assert_close("db", db, bt.grad.numpy())
        return _("equal to torch autograd on 2 random problems")

    return run_check("1.1", "softmax gradient", body, verbose=verbose)


def check_sgd_epoch(sgd_epoch: Callable, *, verbose: bool = True) -> Verdict:
    """Check Exercise 1.2: ``sgd_epoch(W, b, X, y, lr, batches) -> (W, b)``, one step per batch."""

    def body() -> str:
        rng = np.random.default_rng(12)
        X, y = rng.normal(size=(20, 6)), rng.integers(0, 3, size=20)
        W, b = rng.normal(size=(6, 3)), rng.normal(size=3)
        for batch_size in (1, 7, 20):
            batches = list(scratch.minibatches(len(X), batch_size, rng))
            W0, b0 = W.copy(), b.copy()
            with refusing(REFUSED["1.2"]):
                got = sgd_epoch(W, b, X, y, 0.3, batches)
            if not (np.array_equal(W, W0) and np.array_equal(b, b0)):
                raise AssertionError(_("sgd_epoch changed its inputs W or b; work on copies"))
            if not isinstance(got, tuple) or len(got) != 2:
                raise AssertionError(_("sgd_epoch must return a tuple (W, b)"))
            W_ref, b_ref = scratch.sgd_epoch(W, b, X, y, 0.3, batches)
            assert_close(_("W (batch size {size})").format(size=batch_size), got[0], W_ref)
            assert_close(_("b (batch size {size})").format(size=batch_size), got[1], b_ref)
        return _("equal to the reference for batch sizes 1, 7 and 20")

    return run_check("1.2", "mini-batch SGD epoch", body, verbose=verbose)


def check_corr2d(corr2d: Callable, *, verbose: bool = True) -> Verdict:
    """Check Exercise 2.1: ``corr2d(X, K, stride) -> Y`` against ``torch.nn.functional.conv2d``."""

    def body() -> str:
        rng = np.random.default_rng(21)
        for (h, w), (kh, kw), stride in [
            ((4, 4), (2, 2), 1),
            ((7, 9), (3, 2), 2),
            ((6, 5), (1, 3), 3),
        ]:
            X, K = rng.normal(size=(h, w)), rng.normal(size=(kh, kw))
            ref = F.conv2d(torch.tensor(X)[None, None], torch.tensor(K)[None, None], stride=stride)
            with refusing(REFUSED["2.1"]):
                got = corr2d(X, K, stride)
            assert_close(f"corr2d with a {kh}x{kw} kernel, stride {stride}", got, ref[0, 0].numpy())
        return _("equal to torch's conv2d for 3 shapes and strides")

    return run_check("2.1", "2-D cross-correlation", body, verbose=verbose)


def check_max_pool2d(max_pool2d: Callable, *, verbose: bool = True) -> Verdict:
    """Check Exercise 2.2: ``max_pool2d(X, size) -> Y`` for X (N, C, H, W), stride = size."""

    def body() -> str:
        rng = np.random.default_rng(22)
        for shape, size in [((1, 1, 4, 4), 2), ((2, 3, 9, 7), 3), ((2, 2, 6, 6), 2)]:
            X = rng.normal(size=shape)
            ref = F.max_pool2d(torch.tensor(X), size).numpy()
            with refusing(REFUSED["2.2"]):
                got = max_pool2d(X, size)
            assert_close(f"max_pool2d of {shape} with size {size}", got, ref)
        return _("equal to torch's max_pool2d for 3 shapes")

    return run_check("2.2", "max pooling", body, verbose=verbose)


def check_miou(miou: Callable, *, verbose: bool = True) -> Verdict:
    """Check Exercise 2.3: ``miou(pred, target, num_classes) -> float`` (mean IoU)."""

    def body() -> str:
        rng = np.random.default_rng(23)
        cases = [rng.integers(0, 6, size=(2, 8, 8)) for _case in range(2)]
        cases.append(rng.integers(0, 3, size=(2, 8, 8)))  # classes 3..5 absent: skipped
        for i, target in enumerate(cases):
            pred = np.where(
                rng.random(target.shape) < 0.7, target, rng.integers(0, 6, target.shape)
            )
            if i == 2:
                pred = np.where(pred > 3, 0, pred)  # class 3 predicted but absent: IoU 0 counts
            conf = torch.bincount(torch.tensor(target.ravel() * 6 + pred.ravel()), minlength=36)
            expected = segmentation_scores(conf.reshape(6, 6))["miou"]
            with refusing(REFUSED["2.3"]):
                got = float(miou(pred.copy(), target.copy(), 6))
            if not np.isclose(got, expected, atol=1e-9):
                raise AssertionError(
                    _("mIoU {got} on case {case}, expected {expected}").format(
                        got=f"{got:.4f}", case=i + 1, expected=f"{expected:.4f}"
                    )
                )
        return _("equal to the reference on 3 cases, one with absent classes")

    return run_check("2.3", "mean IoU", body, verbose=verbose)
