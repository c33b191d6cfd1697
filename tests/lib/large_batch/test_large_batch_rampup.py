"""Lecture 12: batch ramp-up (Smith et al. 2018) in ``fit`` and on real engines.

The loop trains each epoch with the scheduled batch (fewer steps, so fewer exchanges, per
epoch), bad ramps are refused with the fix, and a data-parallel run with the ramp equals one
process training the same global batches.
"""

from __future__ import annotations

import pytest
from torch.utils.data import TensorDataset

from course_lib.data.digits import load_digits
from course_lib.parallel.data_parallel.reference import (
    max_weight_difference,
    train_one_process,
    weights_match,
)
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.training.batch_schedules import BatchRampUp
from course_lib.training.loop import TrainConfig, fit, make_optimizer
from course_lib.training.lr_schedules import LinearScalingWarmup, StepDecay
from course_lib.training.models import MLP

pytestmark = pytest.mark.timeout(600)


def small_digits() -> TensorDataset:
    """The first 256 training digits."""
    X, y = load_digits().tensors
    return TensorDataset(X[:256], y[:256])


def test_factor_grows_at_each_milestone():
    ramp = BatchRampUp(milestones=(3, 5), factor=2)
    assert [ramp.factor_at(e) for e in range(1, 8)] == [1, 1, 2, 2, 4, 4, 4]
    assert BatchRampUp(milestones=(2,), factor=5).factor_at(2) == 5


def test_fit_trains_each_epoch_with_the_scheduled_batch():
    config = TrainConfig(
        num_epochs=3, lr=0.05, batch_size=64, batch_schedule=BatchRampUp(milestones=(2, 3))
    )
    net, batches = MLP(), []
    net.register_forward_pre_hook(
        lambda m, args: batches.append(len(args[0])) if m.training else None
    )
    history = fit(net, small_digits(), config, progress=False, device="cpu")
    assert batches == [64] * 4 + [128] * 2 + [256]  # 4, then 2, then 1 step per epoch
    assert len(history.step_times) == 7


def test_step_decay_divides_the_lr_where_the_ramp_multiplies_the_batch():
    """Smith et al.'s baseline: the same milestones and factor, on the lr instead of the batch."""
    decay, ramp = StepDecay(milestones=(3, 5), factor=2), BatchRampUp(milestones=(3, 5))
    assert [decay.factor_at(e) for e in range(1, 8)] == [ramp.factor_at(e) for e in range(1, 8)]
    lrs = [decay.lr_at(t, base_lr=0.1, batch_size=64, steps_per_epoch=2) for t in range(10)]
    assert lrs == pytest.approx([0.1] * 4 + [0.05] * 4 + [0.025] * 2)


def test_fit_trains_each_epoch_with_the_decayed_lr_at_the_fixed_batch():
    config = TrainConfig(
        num_epochs=3, lr=0.08, batch_size=64, lr_schedule=StepDecay(milestones=(2, 3), factor=4)
    )
    net, batches, lrs = MLP(), [], []
    net.register_forward_pre_hook(
        lambda m, args: batches.append(len(args[0])) if m.training else None
    )
    optimizer = make_optimizer(net, config)
    optimizer.register_step_pre_hook(lambda opt, *_: lrs.append(opt.param_groups[0]["lr"]))
    fit(net, small_digits(), config, optimizer=optimizer, progress=False, device="cpu")
    assert batches == [64] * 12  # 4 steps in every epoch: the batch stays
    assert lrs == pytest.approx([0.08] * 4 + [0.02] * 4 + [0.005] * 4)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: StepDecay(milestones=(3,), factor=1), "factor must be a number > 1"),
        (lambda: StepDecay(milestones=(4, 2)), "increasing epoch numbers"),
        (lambda: StepDecay(milestones=(1,)), "decay at epoch 1 is no decay"),
        (
            lambda: TrainConfig(num_epochs=3, lr_schedule=StepDecay(milestones=(2, 5))),
            r"milestones \[5\].*num_epochs=3.*train for 5 epochs",
        ),
        (
            lambda: TrainConfig(
                num_epochs=3,
                batch_schedule=BatchRampUp(milestones=(2,)),
                lr_schedule=StepDecay(milestones=(2,)),
            ),
            "not both",
        ),
    ],
)
def test_bad_decays_are_refused_with_the_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: BatchRampUp(milestones=(3,), factor=1), "factor must be an integer >= 2"),
        (lambda: BatchRampUp(milestones=(3,), factor=1.5), "factor must be an integer"),
        (lambda: BatchRampUp(milestones=(4, 2)), "increasing epoch numbers"),
        (lambda: BatchRampUp(milestones=()), "increasing epoch numbers"),
        (lambda: BatchRampUp(milestones=(1, 3)), r"start with batch_size \* 2"),
        (
            lambda: TrainConfig(num_epochs=3, batch_schedule=BatchRampUp(milestones=(2, 5))),
            r"milestones \[5\].*num_epochs=3.*train for 5 epochs",
        ),
        (
            lambda: TrainConfig(
                num_epochs=3,
                batch_schedule=BatchRampUp(milestones=(2,)),
                lr_schedule=LinearScalingWarmup(),
            ),
            "not both",
        ),
    ],
)
def test_bad_ramps_are_refused_with_the_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()


CONFIG = TrainConfig(
    num_epochs=3,
    lr=0.1,
    batch_size=32,
    momentum=0.5,
    seed=5,
    batch_schedule=BatchRampUp(milestones=(2, 3)),
)


def test_ramp_on_engines_equals_one_process_and_exchanges_less(shared_engines):
    """2 ranks, global batch 32 -> 64 -> 128: 8 + 4 + 2 exchanges instead of 3 x 8."""
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
    assert len(result.records) == 2 * (8 + 4 + 2)
    epochs = [r["epoch"] for r in result.records if r["rank"] == 0]
    assert epochs == [1] * 8 + [2] * 4 + [3] * 2  # each record in the epoch it trained in
    plain = train_one_process(
        MLP, small_digits, TrainConfig(**{**CONFIG.__dict__, "batch_schedule": None})
    )
    assert max_weight_difference(plain, want) > 1e-3  # the ramp changed the run
