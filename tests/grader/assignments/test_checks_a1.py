"""A1's checks (no kernel): the instructor's answers pass; stubs, the library's plain versions
(``scratch.py``: cross-entropy without smoothing, SGD without momentum, a convolution's forward
only) and the tempting wrong answers fail, and the first failing case names what is wrong."""

from __future__ import annotations

from pathlib import Path

import nbformat
import numpy as np
import pytest

from course_grader.assignments.a1.checks import (
    check_conv2d_backward,
    check_sgd_momentum,
    check_smoothed_cross_entropy,
)
from course_grader.cells import answer_id
from course_lib.training import scratch

SOURCE = Path(__file__).resolve().parents[3] / "assignments" / "source" / "A1_sgd_conv.ipynb"


def _solution(exercise: str) -> str:
    nb = nbformat.read(SOURCE, as_version=4)
    cell = next(c.source for c in nb.cells if answer_id(c) == exercise)
    return "\n".join(line for line in cell.splitlines() if "###" not in line)


def _define(code: str, name: str):
    namespace = {"np": np}
    exec(code, namespace)
    return namespace[name]


def _mutant(exercise: str, *edits: tuple[str, str]) -> str:
    code = _solution(exercise)
    for old, new in edits:
        assert old in code, f"the solution of {exercise} no longer holds {old!r}"
        code = code.replace(old, new)
    return code


def _stub(*args):
    raise NotImplementedError("Exercise A1.x: write your answer here")


@pytest.mark.parametrize(
    ("check", "exercise", "name"),
    [
        (check_smoothed_cross_entropy, "A1.1", "smoothed_cross_entropy"),
        (check_sgd_momentum, "A1.2", "sgd_momentum"),
        (check_conv2d_backward, "A1.3", "conv2d_backward"),
    ],
)
def test_solution_passes_and_stub_gets_nothing(check, exercise, name):
    verdict = check(_define(_solution(exercise), name), verbose=False)
    assert verdict.passed and verdict.points == verdict.max_points > 0, verdict
    stub = check(_stub, verbose=False)
    assert not stub.passed and stub.points == 0
    assert stub.detail.startswith("not implemented yet"), stub


def test_the_librarys_plain_versions_do_not_answer_a1():
    def plain_cross_entropy(W, b, X, y, eps):  # scratch.py ignores the smoothing
        dW, db = scratch.softmax_regression_grad(W, b, X, y)
        return scratch.softmax_regression_loss(W, b, X, y), dW, db

    def plain_sgd(
        loss_and_grad, W, b, X, y, lr_at, momentum, weight_decay, batch_size, epochs, rng
    ):
        for _ in range(epochs):  # scratch.py's epoch: no momentum, no decay, one learning rate
            batches = list(scratch.minibatches(len(X), batch_size, rng))
            W, b = scratch.sgd_epoch(W, b, X, y, lr_at(0), batches)
        return W, b

    got = check_smoothed_cross_entropy(plain_cross_entropy, verbose=False)
    assert not got.passed and got.detail.startswith("loss (batch 1, 2 classes, eps 0.1) differs")
    got = check_sgd_momentum(plain_sgd, verbose=False)
    assert not got.passed and got.points == 0
    # It passes the first run (plain SGD, though on the unsmoothed loss it differs there too).
    assert got.detail.startswith("W (plain mini-batch SGD) differs"), got


CROSS_ENTROPY_MISTAKES = {
    "eps / (k - 1) on the other classes": (
        [("np.full((n, k), eps / k)", "np.full((n, k), eps / (k - 1))"),
         ("Q[np.arange(n), y] += 1.0 - eps", "Q[np.arange(n), y] = 1.0 - eps")],
        "loss (batch 1, 2 classes, eps 0.1) differs",  # even with 2 classes, torch's differs
    ),
    "log of the softmax": (
        [("log_P = Z - np.log(np.exp(Z).sum(axis=1, keepdims=True))",
          "log_P = np.log(np.exp(Z) / np.exp(Z).sum(axis=1, keepdims=True))")],
        "loss is inf (batch 8, 3 classes, eps 0.3",
    ),
    "sum over the batch in the loss": (
        [("loss = -(Q * log_P).sum() / n", "loss = -(Q * log_P).sum()")],
        "loss (batch 8, 4 classes, eps 0.2) differs",
    ),
    "sum over the batch in the gradient": (
        [("G = (np.exp(log_P) - Q) / n", "G = np.exp(log_P) - Q")],
        "dW (batch 8, 4 classes, eps 0.2) differs",
    ),
    "smoothing ignored": (
        [("np.full((n, k), eps / k)", "np.zeros((n, k))"), ("+= 1.0 - eps", "+= 1.0")],
        "loss (batch 1, 2 classes, eps 0.1) differs",
    ),
}  # fmt: skip


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # log(0), on purpose
@pytest.mark.parametrize("mistake", sorted(CROSS_ENTROPY_MISTAKES))
def test_a1_1_fails_each_tempting_mistake(mistake):
    edits, reason = CROSS_ENTROPY_MISTAKES[mistake]
    fn = _define(_mutant("A1.1", *edits), "smoothed_cross_entropy")
    verdict = check_smoothed_cross_entropy(fn, verbose=False)
    assert not verdict.passed and verdict.points == 0
    assert verdict.detail.startswith(reason), verdict


EPOCH_LOOP = "    for _ in range(num_epochs):\n"
MOMENTUM_MISTAKES = {
    "velocities reset at each epoch": (
        [(EPOCH_LOOP, EPOCH_LOOP + "        V_W, v_b = np.zeros_like(W), np.zeros_like(b)\n")],
        "W (momentum 0.9 over 2 epochs) differs",
    ),
    "step count reset at each epoch": (
        [(EPOCH_LOOP, EPOCH_LOOP + "        t = 0\n")],
        "W (warm-up then step decay) differs",
    ),
    "step count from 1": (
        [("t = 0", "t = 1")],
        "W (warm-up then step decay) differs",
    ),
    "learning rate inside the velocity": (
        [("V_W = momentum * V_W + dW + weight_decay * W",
          "V_W = momentum * V_W + lr_at(t) * (dW + weight_decay * W)"),
         ("v_b = momentum * v_b + db", "v_b = momentum * v_b + lr_at(t) * db"),
         ("W = W - lr_at(t) * V_W", "W = W - V_W"),
         ("b = b - lr_at(t) * v_b", "b = b - v_b")],
        "W (warm-up then step decay) differs",
    ),
    "decay after the momentum (decoupled)": (
        [("+ dW + weight_decay * W", "+ dW"),
         ("W = W - lr_at(t) * V_W", "W = W - lr_at(t) * (V_W + weight_decay * W)")],
        "W (weight decay 0.05 on W) differs",
    ),
    "decay not multiplied by the learning rate": (
        [("+ dW + weight_decay * W", "+ dW"),
         ("W = W - lr_at(t) * V_W", "W = W - lr_at(t) * V_W - weight_decay * W")],
        "W (weight decay 0.05 on W) differs",
    ),
    "bias decayed too": (
        [("v_b = momentum * v_b + db", "v_b = momentum * v_b + db + weight_decay * b")],
        "W (weight decay 0.05 on W) differs",  # b feeds W's gradient: both differ
    ),
    "dampened velocity": (
        [("V_W = momentum * V_W + dW + weight_decay * W",
          "V_W = momentum * V_W + (1 - momentum) * (dW + weight_decay * W)"),
         ("v_b = momentum * v_b + db", "v_b = momentum * v_b + (1 - momentum) * db")],
        "W (momentum 0.9 over 2 epochs) differs",
    ),
}  # fmt: skip


@pytest.mark.parametrize("mistake", sorted(MOMENTUM_MISTAKES))
def test_a1_2_fails_each_tempting_mistake(mistake):
    edits, reason = MOMENTUM_MISTAKES[mistake]
    fn = _define(_mutant("A1.2", *edits), "sgd_momentum")
    verdict = check_sgd_momentum(fn, verbose=False)
    assert not verdict.passed and verdict.points == 0
    assert verdict.detail.startswith(reason), verdict


def test_the_librarys_convolution_is_a_forward_only():
    # Lecture 2's conv2d_naive, handed in as A1.3: it returns Y, not (dX, dK, db).
    def forward(X, K, dY, stride, padding):
        return scratch.conv2d_naive(X[None], K, np.zeros(len(K)), stride, padding)[0]

    got = check_conv2d_backward(forward, verbose=False)
    assert not got.passed and got.detail == "conv2d_backward must return a tuple (dX, dK, db)"


CONV_MISTAKES = {
    "overlapping windows overwrite dX": (
        [("dXp[:, rows, cols] += ", "dXp[:, rows, cols] = ")],
        "dX (3x3 kernel, stride 1, padding 0) is right where one window reads a pixel and wrong "
        "where windows overlap",
    ),
    "the padded dX returned": (
        [("return dXp[:, padding : padding + h, padding : padding + w], dK, db",
          "return dXp, dK, db")],
        "dX (3x2 kernel, stride 1, padding 1) has the padded shape (2, 8, 7): the padding is not",
    ),
    "dK flipped": (
        [("* Xp[None, :, rows, cols]", "* Xp[None, :, rows, cols][..., ::-1, ::-1]")],
        "dK (2x2 kernel, stride 2, padding 0) is flipped",
    ),
    "db the mean over positions": (
        [("db = dY.sum(axis=(1, 2))", "db = dY.mean(axis=(1, 2))")],
        "db (2x2 kernel, stride 2, padding 0) is the mean of dY over the output positions",
    ),
    "stride ignored": (
        [("slice(i * stride, i * stride + kh)", "slice(i, i + kh)"),
         ("slice(j * stride, j * stride + kw)", "slice(j, j + kw)")],
        "dX (2x2 kernel, stride 2, padding 0) differs from the reference",
    ),
    "dK from the unpadded X": (
        [("* Xp[None, :, rows, cols]", "* X[None, :, rows, cols]")],
        "3x2 kernel, stride 1, padding 1: ValueError",
    ),
    "dK of one window only": (
        [("dK += dY", "dK = dY")],
        "dK (2x2 kernel, stride 2, padding 0) holds the last window's share only",
    ),
}  # fmt: skip


@pytest.mark.parametrize("mistake", sorted(CONV_MISTAKES))
def test_a1_3_fails_each_tempting_mistake(mistake):
    edits, reason = CONV_MISTAKES[mistake]
    fn = _define(_mutant("A1.3", *edits), "conv2d_backward")
    verdict = check_conv2d_backward(fn, verbose=False)
    assert not verdict.passed and verdict.points == 0
    assert verdict.detail.startswith(reason), verdict
