"""Lecture 12: batch ramp-up, a larger batch instead of a smaller learning rate (Smith et al. 2018).

Smith, Kindermans, Ying & Le, "Don't Decay the Learning Rate, Increase the Batch Size" (2018):
SGD's noise scale is about $\\epsilon N / B$, so multiplying the batch by ``k`` at the epochs
where a step schedule would divide the learning rate by ``k`` trains about as well, in ``k``
times fewer steps. In data parallelism fewer steps per epoch are fewer exchanges per epoch:
source 000's first idea for cutting communication.

::

    config = TrainConfig(num_epochs=6, batch_size=32, batch_schedule=BatchRampUp(milestones=(3, 5)))
    # epochs 1-2 at batch 32, 3-4 at 64, 5-6 at 128

``fit`` builds each epoch's loader with ``config.batch_size * factor_at(epoch)``; on a
data-parallel rank that is the rank's share, so the global batch grows by the same factor.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchRampUp", "check_milestones_reached", "checked_milestones"]


def checked_milestones(milestones: tuple[int, ...], at_epoch_1: str) -> tuple[int, ...]:
    """Return ``milestones`` as a tuple, or raise ValueError: increasing epochs from 2 on.

    ``at_epoch_1`` is the reason a milestone at epoch 1 is refused, with its fix.
    """
    ms = tuple(milestones)
    if not ms or any(not isinstance(m, int) for m in ms) or list(ms) != sorted(set(ms)):
        raise ValueError(
            f"milestones must be increasing epoch numbers, e.g. (3, 5), got {milestones!r}"
        )
    if ms[0] < 2:
        raise ValueError(f"milestone {ms[0]}: {at_epoch_1}")
    return ms


def check_milestones_reached(milestones: tuple[int, ...], num_epochs: int, what: str) -> None:
    """Raise ValueError naming the fix when a milestone lies after the last epoch (``what``: why)."""
    late = [m for m in milestones if m > num_epochs]
    if late:
        raise ValueError(
            f"milestones {late} come after the last epoch (num_epochs={num_epochs}): the "
            f"{what} there; drop them or train for {max(late)} epochs"
        )


@dataclass(frozen=True)
class BatchRampUp:
    """Multiply the batch by ``factor`` at the start of each epoch in ``milestones`` (from 1)."""

    milestones: tuple[int, ...] = ()
    factor: int = 2

    def __post_init__(self) -> None:
        if not (isinstance(self.factor, int) and self.factor >= 2):
            raise ValueError(
                f"factor must be an integer >= 2 (an integer keeps a global batch that splits "
                f"over the ranks splitting), got {self.factor!r}"
            )
        ms = checked_milestones(
            self.milestones,
            f"a ramp at epoch 1 is no ramp; start with batch_size * {self.factor} instead, "
            "or ramp from epoch 2 on",
        )
        object.__setattr__(self, "milestones", ms)

    def check(self, num_epochs: int) -> None:
        """Raise ValueError naming the fix when a milestone lies after the last epoch."""
        check_milestones_reached(self.milestones, num_epochs, "batch would never grow")

    def factor_at(self, epoch: int) -> int:
        """Return how many times the starting batch epoch ``epoch`` (from 1) uses."""
        return self.factor ** sum(epoch >= m for m in self.milestones)
