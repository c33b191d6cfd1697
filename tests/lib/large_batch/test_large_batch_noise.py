"""Lecture 12: the gradient noise scale measured from the allreduce (McCandlish et al. 2018).

The estimator is checked twice: unbiased on a quadratic whose per-example covariance is known
(a property over many draws: the mean lands within a few standard errors of the truth, which a
wrong formula misses by many), and on real engines training digits, within 20 % of the direct
one-process estimate from many small batches at the same weights: near the initial weights
(a small lr), and like for like at trained weights held fixed while the engines measure
(``noise_scale_at_fixed_weights``; ``bench/bench_noise_scale.py`` records the figures). The
value the progress bar shows while training is the one the records keep.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from course_lib.data.digits import load_digits
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.parallel.exchanges.base import RingAllreduce
from course_lib.parallel.exchanges.ddp import DDPExchange
from course_lib.parallel.large_batch.noise_scale import (
    NoiseScaleExchange,
    direct_noise_scale,
    noise_estimates,
    noise_scale_at_fixed_weights,
    noise_scale_curve,
)
from course_lib.training.loop import TrainConfig, fit, seed_everything
from course_lib.training.models import MLP


@pytest.mark.parametrize("world_size, small_batch", [(2, 4), (4, 8), (8, 2)])
def test_estimates_are_unbiased_on_a_quadratic_with_known_covariance(world_size, small_batch):
    """Per-example loss |theta - x|^2 / 2, x ~ N(mu, Sigma): G = theta - mu, tr(Sigma) known."""
    rng = np.random.default_rng(world_size * 100 + small_batch)
    dim, draws = 6, 20_000
    mu = rng.normal(size=dim)
    root = rng.normal(size=(dim, dim)) / 2
    sigma = root @ root.T
    theta = mu + rng.normal(size=dim)
    true_grad_sq, true_trace = float(np.sum((theta - mu) ** 2)), float(np.trace(sigma))
    # per-example gradients theta - x for every draw, rank and example: (draws, ranks, b, dim)
    x = mu + rng.normal(size=(draws, world_size, small_batch, dim)) @ root.T
    local = (theta - x).mean(axis=2)  # each rank's mean gradient over its b examples
    small_sq = np.sum(local**2, axis=2).mean(axis=1)  # the ranks' mean |G_b|^2 (what rides along)
    big_sq = np.sum(local.mean(axis=1) ** 2, axis=1)  # |G_B|^2 of the averaged gradient
    grad_sq, trace = noise_estimates(small_sq, big_sq, small_batch, small_batch * world_size)
    for estimate, truth in ((grad_sq, true_grad_sq), (trace, true_trace)):
        stderr = estimate.std(ddof=1) / np.sqrt(draws)
        assert abs(estimate.mean() - truth) < 4 * stderr, (estimate.mean(), truth, stderr)
        assert 4 * stderr < 0.1 * truth  # the test has the power to see a wrong formula


def test_noise_estimates_refuse_batches_in_the_wrong_order():
    with pytest.raises(ValueError, match="small batch < big batch"):
        noise_estimates(1.0, 0.5, 32, 32)


def test_noise_scale_needs_a_flat_averaging_exchange():
    with pytest.raises(ValueError, match="ring, builtin"):
        NoiseScaleExchange(DDPExchange())
    with pytest.raises(ValueError, match="EMA decay"):
        NoiseScaleExchange(RingAllreduce(), smoothing=1.0)


CONFIG = TrainConfig(num_epochs=2, lr=0.002, batch_size=128, seed=3)


def test_noise_scale_from_the_allreduce_matches_the_direct_estimate_on_digits(shared_engines):
    """4 ranks of b = 32 (B = 128) on digits; a small lr keeps the weights near the start, where
    the direct estimate (one process, whole-set gradient and 8-example batches) is taken."""
    cluster = shared_engines(4)
    result = train_data_parallel(
        cluster,
        model=MLP,
        dataset=load_digits,
        config=CONFIG,
        method=NoiseScaleExchange(RingAllreduce(), smoothing=0.95),
        comm_timeout=30,
        timeout=300,
    )
    assert result.replicas_equal  # the two riding scalars leave the gradient alone
    steps, measured = noise_scale_curve(result.records)
    by_rank = {r["rank"]: r["noise_scale"] for r in result.records if r["step"] == steps[-1]}
    assert len(set(by_rank.values())) == 1  # every rank computes the same number
    # smoothed as the paper does: EMAs of the two estimates, then their ratio
    grad_sq = trace = 0.0
    for r in sorted((r for r in result.records if r["rank"] == 0), key=lambda r: r["step"]):
        grad_sq = 0.95 * grad_sq + 0.05 * r["noise_grad_sq"]
        trace = 0.95 * trace + 0.05 * r["noise_trace"]
        assert r["noise_scale"] == pytest.approx(trace / grad_sq, rel=1e-9)
        assert r["noise_small_batch"] == 32
    seed_everything(CONFIG.seed)  # rank 0 seeds with seed + 0 before building its replica
    net = MLP()
    start = direct_noise_scale(net, load_digits(), batch_size=8)["noise_scale"]
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.from_numpy(result.weights[name]))
    end = direct_noise_scale(net, load_digits(), batch_size=8)["noise_scale"]
    direct = (start + end) / 2
    numbers = f"B_noise: allreduce {measured[-1]:.1f}, direct {start:.1f} -> {end:.1f}"
    assert abs(end - start) < 0.1 * direct, numbers  # the weights barely moved: one number
    assert abs(measured[-1] - direct) < 0.2 * direct, numbers


def test_noise_scale_from_the_allreduce_matches_the_direct_estimate_at_trained_weights(
    shared_engines,
):
    """Like for like: weights trained 3 epochs (lr 0.05, momentum 0.9), then held fixed while
    4 ranks of b = 32 measure 6 epochs of batches; the direct estimate from every example's
    gradient at those weights. Both the EMA at the last step (what training shows) and the
    ratio of the mean estimates over all steps within 20 %."""
    cluster = shared_engines(4)
    seed_everything(1)
    net = MLP()
    fit(net, load_digits(), TrainConfig(num_epochs=3, lr=0.05, momentum=0.9, batch_size=32, seed=1),
        progress=False, device="cpu")  # fmt: skip
    got = noise_scale_at_fixed_weights(cluster, net, load_digits, batch_size=128, epochs=6)
    numbers = {k: v for k, v in got.items() if k != "result"}
    assert got["weights_moved"] == 0.0, numbers  # every step's gradient at the same weights
    assert got["steps"] == 6 * (1500 // 128), numbers
    assert got["result"].replicas_equal
    for key in ("allreduce", "allreduce_mean"):
        assert abs(got[key] - got["direct"]) < 0.2 * got["direct"], numbers


def test_the_live_noise_scale_is_the_recorded_one(shared_engines):
    """``progress=True``: rank 0 sends B_noise with its step count while it trains; what the
    bar showed (``result.published``) is the value the step's record keeps, the last step's
    included."""
    cluster = shared_engines(4)
    result = train_data_parallel(
        cluster,
        model=MLP,
        dataset=load_digits,
        config=TrainConfig(num_epochs=4, lr=0.05, momentum=0.9, batch_size=64, seed=2),
        method=NoiseScaleExchange(RingAllreduce()),
        progress=True,
        comm_timeout=30,
        timeout=300,
    )
    recorded = {r["step"]: r["noise_scale"] for r in result.records if r["rank"] == 0}
    assert result.published, "nothing was published while training"
    for shown in result.published:
        assert set(shown) == {"step", "noise_scale"}
        assert shown["noise_scale"] == recorded[shown["step"]], (shown, recorded[shown["step"]])
    steps = [shown["step"] for shown in result.published]
    assert steps == sorted(set(steps)) and steps[-1] == max(recorded)


def test_a_run_without_live_notes_publishes_only_its_steps(shared_engines):
    result = train_data_parallel(
        shared_engines(2),
        model=MLP,
        dataset=load_digits,
        config=TrainConfig(num_epochs=1, lr=0.05, batch_size=64),
        method="ring",
        progress=True,
        comm_timeout=30,
        timeout=300,
    )
    assert result.published == []
