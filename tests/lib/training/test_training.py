"""Tests of course_lib.training.loop: one step, evaluation, the loop, its history and settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from course_lib.data import ShardSampler, load_dataset
from course_lib.training.loop import (
    History,
    TrainConfig,
    compute_gradients,
    evaluate,
    fit,
    seed_everything,
    segmentation_scores,
    train_step,
)
from course_lib.training.models import MLP, LeNet, UNet


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits"), load_dataset("digits", train=False)


def test_train_step_equals_manual_sgd():
    seed_everything(0)
    net = MLP()
    X, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    before = [p.detach().clone() for p in net.parameters()]
    loss_fn = nn.CrossEntropyLoss()
    expected_loss = loss_fn(net(X), y)
    grads = torch.autograd.grad(expected_loss, list(net.parameters()))
    loss = train_step(net, X, y, loss_fn, torch.optim.SGD(net.parameters(), lr=0.5))
    assert loss == pytest.approx(expected_loss.item())
    for p, p0, g in zip(net.parameters(), before, grads, strict=True):
        torch.testing.assert_close(p.detach(), p0 - 0.5 * g)


def test_compute_gradients_replaces_old_gradients():
    net = MLP()
    X, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    compute_gradients(net, X, y, nn.CrossEntropyLoss())
    first = [p.grad.clone() for p in net.parameters()]
    compute_gradients(net, X, y, nn.CrossEntropyLoss())  # not accumulated: zeroed first
    for p, g in zip(net.parameters(), first, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_fit_learns_digits_and_is_repeatable(digits):
    train, test = digits
    config = TrainConfig(num_epochs=3, lr=0.1, batch_size=32, momentum=0.9, seed=1)
    runs = []
    for _ in range(2):
        seed_everything(1)
        net = LeNet()
        runs.append((fit(net, train, config, test_set=test, progress=False), net))
    (h1, net1), (h2, net2) = runs
    assert h1.last["test_accuracy"] > 0.5  # chance is 0.1
    assert h1.metric("train_loss")[-1] < h1.metric("train_loss")[0]
    assert h1.metric("test_accuracy") == h2.metric("test_accuracy")
    for a, b in zip(net1.parameters(), net2.parameters(), strict=True):
        assert torch.equal(a, b)
    assert len(h1.step_times) == 3 * int(np.ceil(len(train) / 32)) and min(h1.step_times) > 0


def test_fit_stops_at_target_and_epochs_to_reach(digits):
    train, test = digits
    seed_everything(0)
    config = TrainConfig(num_epochs=20, lr=0.1, momentum=0.9, target=0.6)
    history = fit(MLP(), train, config, test_set=test, progress=False)
    reached = history.epochs_to_reach("test_accuracy", 0.6)
    assert reached == len(history.epochs) < 20
    assert history.epochs_to_reach("test_accuracy", 1.01) is None


def test_grad_hook_runs_between_backward_and_step(digits):
    train, _ = digits
    calls = []

    def zero_grads(net):
        calls.append(all(p.grad is not None for p in net.parameters()))
        for p in net.parameters():
            p.grad.zero_()

    net = MLP()
    before = [p.detach().clone() for p in net.parameters()]
    fit(net, train, TrainConfig(num_epochs=1, batch_size=500), grad_hook=zero_grads, progress=False)
    assert calls == [True, True, True]
    for p, p0 in zip(net.parameters(), before, strict=True):
        assert torch.equal(p, p0)  # zeroed gradients: the step changed nothing


def test_fit_with_a_shard_sampler_sees_only_its_shard():
    X = torch.arange(12, dtype=torch.float32).reshape(12, 1)
    y = torch.zeros(12, dtype=torch.int64)
    seen = []

    class Spy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(1, 2)

        def forward(self, X):
            if self.training:
                seen.extend(X[:, 0].long().tolist())
            return self.lin(X)

    sampler = ShardSampler(12, 1, 3, seed=4)
    fit(
        Spy(),
        TensorDataset(X, y),
        TrainConfig(num_epochs=2, batch_size=2),
        sampler=sampler,
        progress=False,
    )
    from course_lib.data import shard_indices

    expected = shard_indices(12, 1, 3, seed=4, epoch=0) + shard_indices(12, 1, 3, seed=4, epoch=1)
    assert sorted(seen[:4]) == sorted(expected[:4]) and sorted(seen) == sorted(expected)


def test_segmentation_scores_by_hand():
    # truth rows, prediction columns: class 0: 3 right, 1 wrong as 1; class 1: 2 right.
    conf = torch.tensor([[3, 1, 0], [0, 2, 0], [0, 0, 0]])
    scores = segmentation_scores(conf)
    assert scores["accuracy"] == pytest.approx(5 / 6)
    assert scores["miou"] == pytest.approx((3 / 4 + 2 / 3) / 2)  # class 2 absent: skipped


def test_evaluate_segmentation_ignores_label_255():
    net = UNet(base_width=2, depth=1)
    X = torch.rand(2, 3, 8, 8)
    pred = net(X).argmax(1)
    y = pred.clone()
    y[:, :4] = 255  # ignored pixels
    loader = [(X, y)]
    metrics = evaluate(net, loader, nn.CrossEntropyLoss(ignore_index=255))
    assert metrics["accuracy"] == 1.0 and metrics["miou"] == 1.0
    y[:, 4:] = (pred[:, 4:] + 1) % 6  # every labelled pixel wrong
    assert evaluate(net, [(X, y)], nn.CrossEntropyLoss(ignore_index=255))["accuracy"] == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_epochs": 0},
        {"lr": 0.0},
        {"lr": -1},
        {"batch_size": 0},
        {"momentum": 1.0},
        {"optimizer": "rmsprop"},
    ],
)
def test_bad_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        TrainConfig(**kwargs)


def test_history_plot_has_learning_curves():
    history = History(
        epochs=[
            {"epoch": 1, "train_loss": 2.0, "test_accuracy": 0.3},
            {"epoch": 2, "train_loss": 1.0, "test_accuracy": 0.6},
        ]
    )
    fig = history.plot("demo")
    ax_loss, ax_acc = fig.axes
    assert list(ax_loss.lines[0].get_ydata()) == [2.0, 1.0]
    assert list(ax_acc.lines[0].get_ydata()) == [0.3, 0.6]
