"""Lecture 12: steps to a target against batch size, and the critical batch where the curve bends.

Shallue et al., "Measuring the Effects of Data Parallelism on Neural Network Training" (2019):
for each batch size, the fewest optimiser steps to reach a target, with the learning rate tuned
for that batch size. McCandlish et al. (2018) predict the curve's shape,
$S = S_{min} (1 + B_{crit} / B)$: perfect scaling (twice the batch, half the steps) well below
$B_{crit}$, no gain well above it, and $B_{crit} \\approx B_{noise}$.

Everything runs in one process on whole global batches: a data-parallel run with the same
global batch takes the same steps (``tests/lib/large_batch/`` prove it on engines), and one
process is what a sweep of dozens of runs can afford. ``bench/bench_large_batch.py`` runs the
long sweep; the lecture runs a small one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from course_lib.data.digits import load_digits
from course_lib.training.loop import TrainConfig, make_optimizer, seed_everything
from course_lib.training.models import MLP, build_model

__all__ = ["TunedBatch", "fit_steps_model", "predicted_steps", "steps_to_target", "tune_batch"]


def steps_to_target(
    batch: int,
    lr: float,
    seed: int,
    *,
    target: float = 0.95,
    max_steps: int = 3000,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    model: str = "mlp",
) -> int | None:
    """Return the optimiser steps until digits' test accuracy first reaches ``target`` (None: never).

    The MLP on scikit-learn's digits, global batches of ``batch`` drawn without replacement
    (full batches only), the optimiser ``optimizer`` (a ``TrainConfig.optimizer`` name; SGD and
    LARS use ``momentum``); ``model`` a name of ``KNOWN_MODELS`` that takes digits' 1 x 8 x 8
    images: "mlp" or "lenet" (the small CNN for digits). The test accuracy is measured after
    every step (not counted as a step); a loss that turns inf or nan ends the run as a miss.
    """
    seed_everything(seed)
    net = MLP() if model == "mlp" else build_model(model)
    X, y = load_digits().tensors
    X_test, y_test = load_digits(train=False).tensors
    if not 1 <= batch <= len(X):
        raise ValueError(f"batch must be in [1, {len(X)}] (the digits training set), got {batch}")
    config = TrainConfig(lr=lr, batch_size=batch, momentum=momentum, optimizer=optimizer)
    opt = make_optimizer(net, config)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(seed)
    step = 0
    while step < max_steps:
        order = torch.randperm(len(X), generator=generator)
        for idx in order[: len(X) // batch * batch].split(batch):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(X[idx]), y[idx])
            if not torch.isfinite(loss):
                return None
            loss.backward()
            opt.step()
            step += 1
            with torch.no_grad():
                if (net(X_test).argmax(1) == y_test).float().mean().item() >= target:
                    return step
            if step >= max_steps:
                return None
    return None


@dataclass(frozen=True)
class TunedBatch:
    """One batch size's best learning rate on the grid and its steps to the target per seed."""

    batch: int
    lr: float
    steps: tuple[int, ...]

    @property
    def median(self) -> float:
        """Return the median steps over the seeds."""
        return float(statistics.median(self.steps))


def tune_batch(
    batch: int, lrs: list[float], seeds: list[int], **options: object
) -> TunedBatch | None:
    """Return the grid's learning rate with the fewest median steps (None: none reached it).

    A learning rate that misses the target on any seed is not a candidate (Shallue et al. ask
    for a setting that reaches it reliably); ``options`` go to :func:`steps_to_target`.
    """
    best: TunedBatch | None = None
    for lr in lrs:
        steps = []
        for seed in seeds:  # one miss rules the lr out: the other seeds need not run
            steps.append(steps_to_target(batch, lr, seed, **options))  # type: ignore[arg-type]
            if steps[-1] is None:
                break
        if any(s is None for s in steps):
            continue
        tuned = TunedBatch(batch, lr, tuple(int(s) for s in steps))  # type: ignore[arg-type]
        if best is None or tuned.median < best.median:
            best = tuned
    return best


def predicted_steps(batch: np.ndarray | float, s_min: float, b_crit: float) -> np.ndarray:
    """Return $S_{min}(1 + B_{crit}/B)$, McCandlish et al.'s steps to target at batch ``B``."""
    return s_min * (1 + b_crit / np.asarray(batch, dtype=float))


def fit_steps_model(batches: list[int], steps: list[float]) -> tuple[float, float]:
    """Return ``(S_min, B_crit)`` of $S = S_{min}(1 + B_{crit}/B)$, least squares in log steps.

    Log space weighs every batch size alike (in steps the small batches' hundreds would drown
    the large ones' tens); for each B_crit on a fine grid, the best S_min is closed-form.
    """
    if len(batches) != len(steps) or len(batches) < 2:
        raise ValueError(f"need at least two (batch, steps) pairs, got {len(batches)}")
    b, log_s = np.array(batches, float), np.log(np.asarray(steps, float))
    best = (np.inf, 0.0, 0.0)
    for b_crit in np.geomspace(0.1, 1e5, 2000):
        shape = np.log1p(b_crit / b)
        log_s_min = float(np.mean(log_s - shape))
        err = float(np.sum((log_s - log_s_min - shape) ** 2))
        best = min(best, (err, float(np.exp(log_s_min)), float(b_crit)))
    return best[1], best[2]
