"""Lecture 12: linear learning-rate scaling with gradual warm-up (Goyal et al. 2017), for ``fit``.

Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour" (2017), section 2:
*when the minibatch size is multiplied by k, multiply the learning rate by k* (the linear
scaling rule), and, because the rule breaks down in the first steps when the network changes
fast, *gradual warm-up*: start from the learning rate ``base_lr`` tuned at ``reference_batch``
and raise it by a constant amount each step until it reaches ``k * base_lr`` after the
warm-up (5 epochs in the paper).

::

    config = TrainConfig(num_epochs=10, lr=0.05, batch_size=256,
                         lr_schedule=LinearScalingWarmup(reference_batch=32, warmup_epochs=2))

The base learning rate is ``config.lr`` (one number in one place); the schedule adds the
reference batch and the warm-up. ``fit`` sets every parameter group's ``lr`` to
:meth:`LinearScalingWarmup.lr_at` before each optimiser step, with the run's *global* batch (in
data parallelism: the per-rank batch times the number of ranks), so a data-parallel run follows
the same learning rates as one process training on the whole global batch.

:class:`StepDecay` is the baseline of Smith et al. (2018): the learning rate divided by
``factor`` at the start of each epoch in ``milestones``, at a fixed batch. ``BatchRampUp`` with
the same milestones and factor keeps the lr and multiplies the batch instead: the same schedule
of SGD's noise scale $\\epsilon N / B$, in fewer steps.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from course_lib.training.batch_schedules import check_milestones_reached, checked_milestones

__all__ = ["LinearScalingWarmup", "StepDecay", "linear_scaled_lr"]


def linear_scaled_lr(base_lr: float, batch_size: int, reference_batch: int) -> float:
    """Return ``base_lr * batch_size / reference_batch`` (Goyal et al.'s linear scaling rule)."""
    return base_lr * batch_size / reference_batch


@dataclass(frozen=True)
class LinearScalingWarmup:
    """The linear scaling rule with gradual warm-up; invalid values raise ValueError on creation.

    Args:
        reference_batch: the batch size at which the base learning rate (``config.lr``) was
            tuned (256 in Goyal et al.); the peak learning rate is ``lr * B / reference_batch``.
        warmup_epochs: length of the warm-up in epochs (may be fractional), or
        warmup_steps: length of the warm-up in optimiser steps; give at most one (none: no
            warm-up, the scaled learning rate from the first step).
    """

    reference_batch: int = 32
    warmup_epochs: float = 0.0
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.reference_batch, int) and self.reference_batch >= 1):
            raise ValueError(
                f"reference_batch must be a batch size >= 1 (the batch at which lr was tuned), "
                f"got {self.reference_batch!r}"
            )
        if not (self.warmup_epochs >= 0 and math.isfinite(self.warmup_epochs)):
            raise ValueError(
                f"warmup_epochs must be >= 0 (0: no warm-up), got {self.warmup_epochs}"
            )
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(
                f"warmup_steps must be an int >= 0 (0: no warm-up), got {self.warmup_steps!r}"
            )
        if self.warmup_epochs and self.warmup_steps:
            raise ValueError(
                f"give the warm-up once: warmup_epochs={self.warmup_epochs} or "
                f"warmup_steps={self.warmup_steps}, not both"
            )

    def warmup_length(self, steps_per_epoch: int) -> int:
        """Return the warm-up's length in optimiser steps, for epochs of ``steps_per_epoch`` steps."""
        if self.warmup_steps:
            return self.warmup_steps
        return round(self.warmup_epochs * steps_per_epoch)

    def check(self, num_epochs: int, steps_per_epoch: int | None = None) -> None:
        """Raise ValueError naming the fix when the warm-up is longer than the whole training.

        Without ``steps_per_epoch`` (not known before the data loader exists) only a warm-up
        given in epochs is checked. A warm-up exactly as long as training is legal but means
        the peak learning rate is never used: it warns.
        """
        if steps_per_epoch is None:
            if self.warmup_epochs > num_epochs:
                raise ValueError(
                    f"warmup_epochs={self.warmup_epochs} is longer than the training "
                    f"(num_epochs={num_epochs}): shorten the warm-up (Goyal et al. use about a "
                    f"twentieth of training) or train for at least {math.ceil(self.warmup_epochs)} epochs"
                )
            return
        total, warm = num_epochs * steps_per_epoch, self.warmup_length(steps_per_epoch)
        if warm > total:
            raise ValueError(
                f"the warm-up ({warm} steps) is longer than the training ({num_epochs} "
                f"epoch{'s' * (num_epochs != 1)} of "
                f"{steps_per_epoch} steps = {total} steps): use warmup_steps <= {total} (or "
                f"warmup_epochs <= {num_epochs}), or train for at least "
                f"{math.ceil(warm / steps_per_epoch)} epochs"
            )
        if warm == total and warm > 0:
            warnings.warn(
                f"the warm-up lasts the whole training ({total} steps): the peak learning rate "
                "is never reached; shorten it",
                stacklevel=3,
            )

    def peak_lr(self, base_lr: float, batch_size: int) -> float:
        """Return the learning rate after the warm-up for global batch ``batch_size``."""
        return linear_scaled_lr(base_lr, batch_size, self.reference_batch)

    def lr_at(self, step: int, *, base_lr: float, batch_size: int, steps_per_epoch: int) -> float:
        """Return the learning rate of optimiser step ``step`` (counting from 0 over the run).

        $\\eta_t = \\eta + (k\\eta - \\eta)\\, t / T$ for $t < T$ (the warm-up of $T$ steps), then
        $k\\eta$, with $k = B / B_{ref}$ and $\\eta$ = ``base_lr`` (Goyal et al., section 2.2).
        """
        peak = self.peak_lr(base_lr, batch_size)
        warm = self.warmup_length(steps_per_epoch)
        if step >= warm:
            return peak
        return base_lr + (peak - base_lr) * step / warm


@dataclass(frozen=True)
class StepDecay:
    """Divide the learning rate by ``factor`` at the start of each epoch in ``milestones`` (from 1).

    The fixed-batch schedule Smith et al. (2018) replace by ``BatchRampUp(milestones, factor)``:
    epoch ``e`` trains at ``lr / factor ** (milestones <= e)``. Invalid values raise ValueError.
    """

    milestones: tuple[int, ...] = ()
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (isinstance(self.factor, int | float) and self.factor > 1):
            raise ValueError(
                f"factor must be a number > 1 (the lr is divided by it), got {self.factor!r}"
            )
        ms = checked_milestones(
            self.milestones,
            f"a decay at epoch 1 is no decay; start with lr / {self.factor} instead, "
            "or decay from epoch 2 on",
        )
        object.__setattr__(self, "milestones", ms)

    def check(self, num_epochs: int, steps_per_epoch: int | None = None) -> None:
        """Raise ValueError naming the fix when a milestone lies after the last epoch."""
        check_milestones_reached(self.milestones, num_epochs, "lr would never decay")

    def factor_at(self, epoch: int) -> float:
        """Return by how much epoch ``epoch`` (from 1) divides the starting learning rate."""
        return self.factor ** sum(epoch >= m for m in self.milestones)

    def lr_at(self, step: int, *, base_lr: float, batch_size: int, steps_per_epoch: int) -> float:
        """Return the learning rate of optimiser step ``step`` (from 0; ``batch_size`` unused)."""
        return base_lr / self.factor_at(step // steps_per_epoch + 1)
