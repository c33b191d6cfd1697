"""Tests of course_lib.training.scratch (from-scratch SGD, conv, pooling) and the lecture 1-2 checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from lecture01_answers import sgd_epoch as answer_epoch
from lecture01_answers import softmax_grad as answer_grad
from lecture02_answers import corr2d as answer_corr2d
from lecture02_answers import max_pool2d as answer_pool

from course_lib.checks import lecture01_02 as checks
from course_lib.training import scratch
from course_lib.training.loop import segmentation_scores

# ---- from-scratch operators equal torch's -------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 3),
    o=st.integers(1, 3),
    h=st.integers(3, 9),
    w=st.integers(3, 9),
    kh=st.integers(1, 3),
    kw=st.integers(1, 3),
    stride=st.integers(1, 3),
    padding=st.integers(0, 2),
    seed=st.integers(0, 999),
)
def test_conv2d_equals_torch(n, c, o, h, w, kh, kw, stride, padding, seed):
    rng = np.random.default_rng(seed)
    X, W, b = rng.normal(size=(n, c, h, w)), rng.normal(size=(o, c, kh, kw)), rng.normal(size=o)
    ref = F.conv2d(torch.tensor(X), torch.tensor(W), torch.tensor(b), stride, padding).numpy()
    np.testing.assert_allclose(scratch.conv2d(X, W, b, stride, padding), ref, atol=1e-10)
    np.testing.assert_allclose(scratch.conv2d_naive(X, W, b, stride, padding), ref, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(2, 9), st.integers(2, 9)),
    size=st.integers(1, 3),
    stride=st.none() | st.integers(1, 3),
    seed=st.integers(0, 999),
)
def test_max_pool2d_equals_torch(shape, size, stride, seed):
    X = np.random.default_rng(seed).normal(size=shape)
    if size > min(shape[2:]):
        return
    ref = F.max_pool2d(torch.tensor(X), size, stride).numpy()
    np.testing.assert_array_equal(scratch.max_pool2d(X, size, stride), ref)
    np.testing.assert_array_equal(scratch.max_pool2d_naive(X, size, stride), ref)


def test_corr2d_source_001_example():
    X = np.arange(9.0).reshape(3, 3)
    K = np.array([[0.0, 1.0], [2.0, 3.0]])
    np.testing.assert_array_equal(scratch.corr2d(X, K), [[19.0, 25.0], [37.0, 43.0]])


# ---- from-scratch SGD equals autograd -----------------------------------------------------------


def test_softmax_grad_equals_autograd():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(16, 5)), rng.integers(0, 4, size=16)
    W, b = rng.normal(size=(5, 4)), rng.normal(size=4)
    Wt, bt = torch.tensor(W, requires_grad=True), torch.tensor(b, requires_grad=True)
    loss = F.cross_entropy(torch.tensor(X) @ Wt + bt, torch.tensor(y))
    loss.backward()
    dW, db = scratch.softmax_regression_grad(W, b, X, y)
    np.testing.assert_allclose(dW, Wt.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(db, bt.grad.numpy(), atol=1e-12)
    assert scratch.softmax_regression_loss(W, b, X, y) == pytest.approx(loss.item())


def test_minibatches_cover_each_epoch_once():
    batches = list(scratch.minibatches(10, 4, np.random.default_rng(0)))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(np.concatenate(batches).tolist()) == list(range(10))


def test_training_lowers_the_loss_and_gd_is_deterministic():
    from course_lib.data import digits_arrays

    X, y = digits_arrays()
    _, _, losses = scratch.train_softmax_regression(X, y, lr=0.5, batch_size=64, num_epochs=3)
    assert losses[-1] < losses[0] < np.log(10)
    a = scratch.train_softmax_regression(X, y, lr=0.5, batch_size=len(X), num_epochs=2, seed=1)
    b = scratch.train_softmax_regression(X, y, lr=0.5, batch_size=len(X), num_epochs=2, seed=2)
    np.testing.assert_allclose(a[0], b[0])  # full-batch GD ignores the shuffle


# ---- checks: PASS on a reference, FAIL on the stub and on plausible wrong answers ----------------


def _stub(exercise):
    def stub(*args, **kwargs):
        raise NotImplementedError(f"Exercise {exercise}: write this function")

    return stub


def test_check_softmax_grad():
    assert checks.check_softmax_grad(answer_grad).passed
    assert not checks.check_softmax_grad(scratch.softmax_regression_grad).passed  # refused

    def reference(W, b, X, y):  # a student's own, written differently
        P = np.exp(X @ W + b)
        P /= P.sum(1, keepdims=True)
        Y = np.eye(W.shape[1])[y]
        return X.T @ (P - Y) / len(X), (P - Y).mean(0)

    assert checks.check_softmax_grad(reference).passed
    stub = checks.check_softmax_grad(_stub("1.1"))
    assert not stub.passed and "not implemented yet" in str(stub)

    def no_mean(W, b, X, y):  # forgot to divide by N
        dW, db = answer_grad(W, b, X, y)
        return dW * len(X), db * len(X)

    assert not checks.check_softmax_grad(no_mean).passed
    assert "dW" in checks.check_softmax_grad(lambda W, b, X, y: (W.T, b)).detail


def test_check_sgd_epoch():
    assert checks.check_sgd_epoch(answer_epoch).passed
    assert not checks.check_sgd_epoch(scratch.sgd_epoch).passed  # the library's: refused
    assert not checks.check_sgd_epoch(_stub("1.2")).passed

    def one_full_batch_step(W, b, X, y, lr, batches):  # GD, not one step per batch
        idx = np.concatenate(batches)
        dW, db = answer_grad(W, b, X[idx], y[idx])
        return W - lr * dW, b - lr * db

    assert not checks.check_sgd_epoch(one_full_batch_step).passed

    def in_place(W, b, X, y, lr, batches):  # right numbers, but overwrites the caller's W
        for idx in batches:
            dW, db = answer_grad(W, b, X[idx], y[idx])
            W -= lr * dW
            b -= lr * db
        return W, b

    verdict = checks.check_sgd_epoch(in_place)
    assert not verdict.passed and "changed its inputs" in verdict.detail


def test_check_corr2d():
    assert checks.check_corr2d(answer_corr2d).passed
    assert not checks.check_corr2d(scratch.corr2d).passed  # the library's: refused
    assert not checks.check_corr2d(_stub("2.1")).passed

    def flipped(X, K, stride=1):  # the textbook convolution flips the kernel; torch does not
        return answer_corr2d(X, K[::-1, ::-1], stride)

    assert not checks.check_corr2d(flipped).passed
    assert not checks.check_corr2d(lambda X, K, stride=1: answer_corr2d(X, K)).passed  # no stride


def test_check_max_pool2d():
    assert checks.check_max_pool2d(answer_pool).passed
    assert not checks.check_max_pool2d(scratch.max_pool2d).passed  # the library's: refused
    assert not checks.check_max_pool2d(_stub("2.2")).passed

    def average(X, size):
        return torch.nn.functional.avg_pool2d(torch.tensor(X), size).numpy()

    assert not checks.check_max_pool2d(average).passed
    crash = checks.check_max_pool2d(lambda X, size: X[:, :, ::size])  # wrong shape, no crash
    assert not crash.passed and "shape" in crash.detail


def test_check_miou():
    def reference(pred, target, num_classes):
        ious = []
        for c in range(num_classes):
            inter = np.sum((pred == c) & (target == c))
            union = np.sum((pred == c) | (target == c))
            if union:
                ious.append(inter / union)
        return float(np.mean(ious))

    assert checks.check_miou(reference).passed
    assert not checks.check_miou(_stub("2.3")).passed

    def pixel_accuracy(pred, target, num_classes):
        return float((pred == target).mean())

    assert not checks.check_miou(pixel_accuracy).passed

    def counts_absent_as_zero(pred, target, num_classes):
        conf = np.bincount(target.ravel() * num_classes + pred.ravel(), minlength=num_classes**2)
        conf = conf.reshape(num_classes, num_classes)
        tp = np.diag(conf)
        union = conf.sum(0) + conf.sum(1) - tp
        return float(np.mean(tp / np.maximum(union, 1)))

    assert not checks.check_miou(counts_absent_as_zero).passed
    assert segmentation_scores(torch.eye(3, dtype=torch.int64))["miou"] == 1.0


def test_a_crashing_answer_is_a_verdict_not_an_exception():
    verdict = checks.check_corr2d(lambda X, K, stride=1: 1 / 0)
    assert not verdict.passed and "ZeroDivisionError" in verdict.detail
