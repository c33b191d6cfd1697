"""Lecture 12: Where linear scaling stops, with its causes kept apart: a fixed step budget, a warm-up fixed in steps, no data dropped.

Training "the same epochs" at a larger batch confounds three things: fewer steps (at B = 1024
ten epochs of digits are ten steps), a warm-up counted in epochs (one epoch is one step there:
no warm-up at all) and images dropped by full batches (``1500 // 1024`` keeps 1024 of 1500 an
epoch). :func:`accuracy_after_steps` removes each: every run takes the same number of optimiser
steps, the warm-up lasts the same number of steps (Goyal et al.'s gradual warm-up from the base
rate, :class:`~course_lib.training.lr_schedules.LinearScalingWarmup`), and the batches are cut
from one stream of epochs, each a fresh permutation, so every image is used once an epoch and
none is dropped. What still fails then fails for the learning rate, not for the budget.
One process on whole global batches, as :mod:`.critical_batch` (a data-parallel run with the
same global batch takes the same steps).
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.data.digits import load_digits
from course_lib.training.loop import TrainConfig, make_optimizer, seed_everything
from course_lib.training.lr_schedules import LinearScalingWarmup
from course_lib.training.models import MLP

__all__ = ["accuracy_after_steps", "batches_without_dropping"]


def batches_without_dropping(
    n: int, batch: int, steps: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """Return ``steps`` index batches cut from consecutive permutations of ``range(n)`` (none dropped)."""
    if not 1 <= batch:
        raise ValueError(f"batch must be >= 1, got {batch}")
    stream = torch.cat([torch.randperm(n, generator=generator)
                        for _ in range(-(-steps * batch // n))])  # fmt: skip
    return list(stream[: steps * batch].split(batch))


def accuracy_after_steps(
    batch: int,
    *,
    base_lr: float,
    steps: int,
    warmup_steps: int,
    seed: int,
    reference_batch: int = 32,
    max_lr: float | None = None,
    momentum: float = 0.9,
) -> float | None:
    """Return digits' test accuracy after ``steps`` SGD steps at global batch ``batch`` (None: diverged).

    The rate follows Goyal et al.'s rule: ``base_lr`` x ``batch / reference_batch`` after a
    linear warm-up of ``warmup_steps`` steps from ``base_lr``; ``max_lr`` caps it (None: the
    rule's peak). Batches come from :func:`batches_without_dropping`.
    """
    seed_everything(seed)
    net = MLP()
    X, y = load_digits().tensors
    X_test, y_test = load_digits(train=False).tensors
    schedule = LinearScalingWarmup(reference_batch=reference_batch, warmup_steps=warmup_steps)
    opt = make_optimizer(net, TrainConfig(lr=base_lr, batch_size=batch, momentum=momentum))
    loss_fn = nn.CrossEntropyLoss()
    batches = batches_without_dropping(len(X), batch, steps, torch.Generator().manual_seed(seed))
    for step, idx in enumerate(batches):
        lr = schedule.lr_at(step, base_lr=base_lr, batch_size=batch, steps_per_epoch=1)
        for group in opt.param_groups:
            group["lr"] = lr if max_lr is None else min(lr, max_lr)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(X[idx]), y[idx])
        if not torch.isfinite(loss):
            return None
        loss.backward()
        opt.step()
    with torch.no_grad():
        return (net(X_test).argmax(1) == y_test).float().mean().item()
