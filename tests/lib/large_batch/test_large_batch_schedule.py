"""Lecture 12: linear learning-rate scaling with gradual warm-up (Goyal et al. 2017) in ``fit``.

The schedule's numbers against the paper's rule, the loop applying them before every step, a
warm-up longer than training refused with the fix, and on real engines: a data-parallel run
with the schedule equals one process training the whole global batch with the same schedule.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from course_lib.data.digits import load_digits
from course_lib.parallel.data_parallel.reference import (
    max_weight_difference,
    train_one_process,
    weights_match,
)
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.training.loop import TrainConfig, fit, make_optimizer
from course_lib.training.lr_schedules import LinearScalingWarmup, linear_scaled_lr
from course_lib.training.models import MLP

pytestmark = pytest.mark.timeout(600)


def small_digits() -> TensorDataset:
    """The first 256 training digits: 4 global batches of 64 per epoch."""
    X, y = load_digits().tensors
    return TensorDataset(X[:256], y[:256])


def test_lr_rises_linearly_from_base_to_the_scaled_peak():
    schedule = LinearScalingWarmup(reference_batch=16, warmup_steps=4)
    lrs = [schedule.lr_at(t, base_lr=0.1, batch_size=64, steps_per_epoch=10) for t in range(7)]
    # k = 64 / 16 = 4: from 0.1 up by (0.4 - 0.1) / 4 a step, then 0.4 (Goyal et al. 2.2)
    assert lrs == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4, 0.4])
    assert linear_scaled_lr(0.1, 256, 32) == pytest.approx(0.8)
    by_epochs = LinearScalingWarmup(reference_batch=16, warmup_epochs=0.5)
    assert by_epochs.warmup_length(steps_per_epoch=8) == 4
    assert by_epochs.lr_at(2, base_lr=0.1, batch_size=64, steps_per_epoch=8) == pytest.approx(0.25)


def test_fit_sets_the_scheduled_lr_before_every_step():
    schedule = LinearScalingWarmup(reference_batch=16, warmup_epochs=1)
    config = TrainConfig(num_epochs=2, lr=0.05, batch_size=64, lr_schedule=schedule)
    net, data = MLP(), small_digits()
    optimizer = make_optimizer(net, config)
    seen: list[float] = []
    optimizer.register_step_pre_hook(lambda opt, *_: seen.append(opt.param_groups[0]["lr"]))
    fit(net, data, config, optimizer=optimizer, progress=False, device="cpu")
    want = [schedule.lr_at(t, base_lr=0.05, batch_size=64, steps_per_epoch=4) for t in range(8)]
    assert seen == pytest.approx(want)
    assert seen[0] == pytest.approx(0.05) and seen[-1] == pytest.approx(0.2)


def test_warmup_longer_than_training_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="longer than the training.*shorten the warm-up"):
        TrainConfig(num_epochs=2, lr_schedule=LinearScalingWarmup(warmup_epochs=3))
    # in steps, only the loader knows the epoch's length: fit refuses before the first step
    config = TrainConfig(
        num_epochs=2, batch_size=64, lr_schedule=LinearScalingWarmup(warmup_steps=9)
    )
    net = MLP()
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(
        ValueError, match=r"9 steps.*2 epochs of 4 steps = 8 steps.*warmup_steps <= 8"
    ):
        fit(net, small_digits(), config, progress=False, device="cpu")
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    whole = TrainConfig(
        num_epochs=1, batch_size=64, lr_schedule=LinearScalingWarmup(warmup_epochs=1)
    )
    with pytest.warns(UserWarning, match="never reached"):  # legal but pointless
        fit(net, small_digits(), whole, progress=False, device="cpu")


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"reference_batch": 0}, "reference_batch"),
        ({"warmup_epochs": -1}, "warmup_epochs"),
        ({"warmup_steps": 2.5}, "warmup_steps"),
        ({"warmup_steps": 3, "warmup_epochs": 1}, "not both"),
    ],
)
def test_bad_schedule_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        LinearScalingWarmup(**bad)


CONFIG = TrainConfig(
    num_epochs=2,
    lr=0.05,
    batch_size=64,
    momentum=0.5,
    seed=4,
    lr_schedule=LinearScalingWarmup(reference_batch=8, warmup_epochs=1),
)


def test_warmup_on_engines_equals_one_process_with_the_same_schedule(shared_engines):
    """2 ranks of 32 (global 64): the lr climbs 0.05 -> 0.4 over the first epoch on both."""
    cluster = shared_engines(2)
    result = train_data_parallel(
        cluster,
        model=MLP,
        dataset=small_digits,
        config=CONFIG,
        method="ring",
        comm_timeout=30,
        timeout=300,
    )
    want = train_one_process(MLP, small_digits, CONFIG)
    assert result.replicas_equal
    assert weights_match(result.weights, want), max_weight_difference(result.weights, want)
    # the schedule changed the run: without it one process ends elsewhere
    plain = train_one_process(
        MLP, small_digits, TrainConfig(**{**CONFIG.__dict__, "lr_schedule": None})
    )
    assert max_weight_difference(plain, want) > 1e-3
