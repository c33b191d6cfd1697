"""Lectures 1 and 2's checks: the instructor's answers pass; the notebooks' stubs, answers that
call the lecture's ``scratch`` module and plausible mistakes fail with a reason."""

from __future__ import annotations

import numpy as np
import pytest
from lecture01_answers import sgd_epoch, softmax_grad
from lecture02_answers import corr2d, max_pool2d, miou
from lecture_notebooks import notebook_function

from course_lib.checks.lecture01_02 import (
    check_corr2d,
    check_max_pool2d,
    check_miou,
    check_sgd_epoch,
    check_softmax_grad,
)
from course_lib.training import scratch
from course_lib.training.scratch import corr2d as imported_corr2d

EXERCISES = [  # (check, answer, notebook, stub name, an answer that delegates, its callee)
    (check_softmax_grad, softmax_grad, "01_sequential_sgd.ipynb", "softmax_grad",
     lambda W, b, X, y: scratch.softmax_regression_grad(W, b, X, y), "softmax_regression_grad"),
    (check_sgd_epoch, sgd_epoch, "01_sequential_sgd.ipynb", "sgd_epoch",
     lambda W, b, X, y, lr, batches: scratch.sgd_epoch(W, b, X, y, lr, batches), "scratch.sgd_epoch"),
    (check_corr2d, corr2d, "02_cnn.ipynb", "corr2d",
     lambda X, K, stride=1: imported_corr2d(X, K, stride), "scratch.corr2d"),
    (check_max_pool2d, max_pool2d, "02_cnn.ipynb", "max_pool2d",
     lambda X, size: scratch.max_pool2d(X, size), "scratch.max_pool2d"),
    (check_miou, miou, "02_cnn.ipynb", "miou", None, None),
]  # fmt: skip


@pytest.mark.parametrize("check, answer, notebook, name, delegate, callee", EXERCISES)
def test_answer_passes_stub_and_delegation_fail(check, answer, notebook, name, delegate, callee):
    verdict = check(answer, verbose=False)
    assert verdict, verdict.detail
    stub = check(notebook_function(notebook, name), verbose=False)
    assert not stub and "not implemented yet" in stub.detail
    if delegate is not None:
        verdict = check(delegate, verbose=False)
        assert not verdict and callee in verdict.detail and "answers the exercise" in verdict.detail


def test_miou_through_the_library_scores_is_refused():
    import torch

    from course_lib.training.loop import segmentation_scores

    def via_scores(pred, target, num_classes):
        flat = torch.tensor(target.ravel() * num_classes + pred.ravel())
        conf = torch.bincount(flat, minlength=num_classes**2)
        return segmentation_scores(conf.reshape(num_classes, num_classes))["miou"]

    verdict = check_miou(via_scores, verbose=False)
    assert not verdict and "segmentation_scores" in verdict.detail
    assert segmentation_scores(torch.eye(2))["miou"] == 1.0  # restored once the check is over


def test_plausible_mistakes_fail():
    def grad_without_mean(W, b, X, y):
        dW, db = softmax_grad(W, b, X, y)
        return dW * len(y), db * len(y)

    def sgd_in_place(W, b, X, y, lr, batches):
        for idx in batches:
            dW, db = softmax_grad(W, b, X[idx], y[idx])
            W -= lr * dW
            b -= lr * db
        return W, b

    def full_correlation(X, K, stride=1):  # ignores the stride
        return corr2d(X, K, 1)

    def mean_over_all_classes(pred, target, num_classes):
        return float(np.mean([
            np.logical_and(pred == c, target == c).sum() / max(1, np.logical_or(pred == c, target == c).sum())
            for c in range(num_classes)
        ]))  # fmt: skip

    assert "dW differs" in check_softmax_grad(grad_without_mean, verbose=False).detail
    assert "changed its inputs" in check_sgd_epoch(sgd_in_place, verbose=False).detail
    assert "shape" in check_corr2d(full_correlation, verbose=False).detail
    assert "mIoU" in check_miou(mean_over_all_classes, verbose=False).detail
