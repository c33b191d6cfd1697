"""Mixing matrices of the averaging schemes against what is known of them (no engines needed)."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.collectives.mixing import (
    allreduce_matrix,
    contraction,
    fit_noise_scale,
    gossip_distances,
    gossip_matrix,
    is_doubly_stochastic,
    predict_consensus,
    predict_drift,
    rotation_product,
    scheme_schedule,
    spectral_gap,
)


@pytest.mark.parametrize("p", range(1, 9))
def test_every_scheme_is_doubly_stochastic(p):
    matrices = [allreduce_matrix(p), rotation_product(p)]
    matrices += [gossip_matrix(p, s) for s in range(1, max(2, p // 2 + 1)) if p > 1]
    assert all(is_doubly_stochastic(w) for w in matrices)
    assert not is_doubly_stochastic(allreduce_matrix(p) + np.eye(p) * 0.1)


def test_allreduce_reaches_consensus_in_one_step():
    for p in range(2, 9):
        assert spectral_gap(allreduce_matrix(p)) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("p", [5, 6, 7, 8, 16])
def test_ring_gossip_has_the_circulant_eigenvalues(p):
    # Source 001's "K": 1/3 on the diagonal and both ring neighbours, a circulant whose
    # eigenvalues are (1 + 2 cos(2 pi k / P)) / 3, k = 0..P-1.
    want = np.sort((1 + 2 * np.cos(2 * np.pi * np.arange(p) / p)) / 3)
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(gossip_matrix(p, 1))), want, atol=1e-12)
    second = max(abs(v) for v in want[:-1])  # all but the eigenvalue 1 of the mean
    assert spectral_gap(gossip_matrix(p, 1)) == pytest.approx(1 - second, abs=1e-12)


def test_two_ranks_share_one_partner_counted_twice():
    np.testing.assert_allclose(gossip_matrix(2, 1), [[1 / 3, 2 / 3], [2 / 3, 1 / 3]])
    np.testing.assert_allclose(gossip_matrix(4, 2)[0], [1 / 3, 0, 2 / 3, 0])
    assert gossip_distances(2, 3) == [1, 1, 1] and gossip_distances(7, 4) == [1, 2, 3, 1]


def test_the_rotation_mixes_faster_than_the_ring_alone_from_five_ranks():
    for p in range(5, 17):
        ring = np.linalg.matrix_power(gossip_matrix(p, 1), p // 2)  # as many steps, s = 1 only
        assert spectral_gap(rotation_product(p)) > spectral_gap(ring), p
    # At P = 4 the step s = 2 has one partner, counted twice (weight 2/3): that rotation
    # (gap 2/3) mixes worse than two ring steps (gap 8/9).
    ring4 = np.linalg.matrix_power(gossip_matrix(4, 1), 2)
    assert spectral_gap(rotation_product(4)) == pytest.approx(2 / 3)
    assert spectral_gap(ring4) == pytest.approx(8 / 9)


def test_consensus_stays_within_the_spectral_bound():
    rng = np.random.default_rng(0)
    p = 7
    x = rng.standard_normal((p, 5))
    matrices = [gossip_matrix(p, s) for s in gossip_distances(p, 12)]
    bound = predict_consensus(matrices, np.linalg.norm(x - x.mean(0)))
    for k, w in enumerate(matrices, start=1):
        x = w @ x
        assert np.linalg.norm(x - x.mean(0)) <= bound[k] + 1e-12
    assert bound[-1] < 0.1 * bound[0]


def test_predicted_drift_matches_a_simulated_random_walk_and_resets_at_allreduce():
    p, steps = 4, 8
    walk = predict_drift(scheme_schedule(p, steps, averaging="none"), p, sigma=2.0)
    np.testing.assert_allclose(walk, 2.0 * np.sqrt(np.arange(1, steps + 1) * (p - 1) / p))
    local = predict_drift(scheme_schedule(p, steps, period=4), p)
    assert local[3] == local[7] == 0 and local[2] > local[1] > local[0] > 0
    # Monte Carlo: independent noise, gossip every step, RMS distance from the mean.
    rng, runs = np.random.default_rng(1), 4000
    schedule = scheme_schedule(p, steps, averaging="gossip")
    x = np.zeros((runs, p))
    measured = []
    for w in schedule:
        x = (x + rng.standard_normal((runs, p))) @ w.T
        measured.append(np.sqrt(((x - x.mean(1, keepdims=True)) ** 2).mean()))
    predicted = predict_drift(schedule, p)
    np.testing.assert_allclose(measured, predicted, rtol=0.05)
    assert fit_noise_scale(predicted, 3 * predicted) == pytest.approx(3.0)
    assert contraction(allreduce_matrix(p)) == pytest.approx(0.0, abs=1e-12)


def test_predicted_drift_of_gradient_gossip_matches_a_simulation():
    # Source 001's Algorithm 2 mixes the noise (gradients), never the weights.
    p, steps, runs = 6, 6, 4000  # s = 3 meets one partner twice
    mixes = [gossip_matrix(p, s) for s in gossip_distances(p, steps)]
    rng, x, measured = np.random.default_rng(2), np.zeros((runs, p)), []
    for m in mixes:
        x = x + rng.standard_normal((runs, p)) @ m.T
        measured.append(np.sqrt(((x - x.mean(1, keepdims=True)) ** 2).mean()))
    schedule = scheme_schedule(p, steps, averaging="none")
    predicted = predict_drift(schedule, p, noise_mixing=mixes)
    np.testing.assert_allclose(measured, predicted, rtol=0.05)
    assert (predicted < predict_drift(schedule, p)).all()  # mixed noise drifts less
