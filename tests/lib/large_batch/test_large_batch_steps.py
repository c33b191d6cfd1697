"""Lecture 12: steps to a target against batch size (Shallue et al. 2019) and the fitted bend.

The fit recovers $S_{min}$ and $B_{crit}$ from exact points of McCandlish et al.'s curve; the
sweep's pieces count steps, refuse a bad batch, treat a diverging learning rate as a miss, and
tune the learning rate to the grid's fastest.
"""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.parallel.large_batch.critical_batch import (
    fit_steps_model,
    predicted_steps,
    steps_to_target,
    tune_batch,
)


def test_fit_recovers_the_bend_of_an_exact_curve():
    batches = [4, 16, 64, 256, 1024]
    steps = predicted_steps(np.array(batches), s_min=20.0, b_crit=80.0)
    s_min, b_crit = fit_steps_model(batches, list(steps))
    assert s_min == pytest.approx(20.0, rel=0.01) and b_crit == pytest.approx(80.0, rel=0.01)
    with pytest.raises(ValueError, match="at least two"):
        fit_steps_model([8], [100.0])


def test_steps_to_target_counts_steps_and_misses_when_training_diverges():
    steps = steps_to_target(256, 0.64, seed=0, target=0.9, max_steps=200)
    assert steps is not None and 5 < steps < 200
    assert steps_to_target(256, 0.64, seed=0, target=0.9, max_steps=steps) == steps  # exact count
    assert steps_to_target(256, 0.64, seed=0, target=0.9, max_steps=steps - 1) is None
    assert steps_to_target(256, 1e4, seed=0, target=0.9, max_steps=50) is None  # diverges
    with pytest.raises(ValueError, match="batch must be in"):
        steps_to_target(0, 0.1, seed=0)


def test_tune_batch_keeps_the_fastest_lr_that_reaches_the_target_on_every_seed():
    tuned = tune_batch(256, [0.01, 0.64, 1e4], seeds=[0, 1], target=0.9, max_steps=150)
    assert tuned is not None and tuned.lr == 0.64 and len(tuned.steps) == 2
    assert tuned.median == pytest.approx(np.median(tuned.steps))
    assert tune_batch(256, [1e4], seeds=[0], target=0.9, max_steps=50) is None
    lamb = tune_batch(256, [0.03], seeds=[0], target=0.9, max_steps=300, optimizer="lamb")
    assert lamb is not None  # the layer-wise optimisers are reachable by name


def test_the_small_cnn_is_swept_the_same_way():
    """``model="lenet"``: the small CNN for digits, the same batches and the same exact count."""
    steps = steps_to_target(256, 0.32, seed=0, target=0.5, max_steps=100, model="lenet")
    assert steps is not None and steps < 100
    assert steps_to_target(256, 0.32, 0, target=0.5, max_steps=steps - 1, model="lenet") is None
