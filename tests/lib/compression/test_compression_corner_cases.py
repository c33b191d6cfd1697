"""Corner cases of compressors at the edges of their number formats (issue 22, item 5).

QSGD's norm at the edges of float32 (gradients of 1e20 and 1e-23), sign's scale near float32's
largest value, and the float16 compressor's
mean of N ranks whose values sit at float16's largest, 65504. References: QSGD's error bound
$|\\hat g_i - g_i| \\le \\|g\\|_2 / s$ and the float64 mean of the float16 inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from course_lib.compression import make_compressor

QUICK = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FLOAT16_MAX = 65504.0
HALF_ULP = 2.0**-11  # float16's relative rounding error


def qsgd_roundtrip(g: np.ndarray, levels: int = 7, seed: int = 0) -> np.ndarray:
    comp = make_compressor("qsgd", levels=levels, seed=seed)
    payload, _ = comp.compress(g, "w")
    return comp.decompress(payload)


def within_qsgd_bound(g: np.ndarray, decoded: np.ndarray, levels: int) -> bool:
    norm = np.linalg.norm(g.astype(np.float64))
    err = np.abs(decoded.astype(np.float64) - g.astype(np.float64))
    return bool(np.all(err <= norm / levels * (1 + 1e-5)))


@pytest.mark.parametrize("scale", [1e20, 1e-23])
def test_qsgd_decodes_huge_and_tiny_gradients_within_its_bound(scale):
    # float32 squares overflow at 1e20 (the norm was inf: decoded 0 * inf = NaN) and underflow
    # at 1e-23 (the norm was 0: decoded all zeros)
    g = (np.array([1.0, -1.0, 1.0, 1.0]) * scale).astype(np.float32)
    for seed in range(5):
        decoded = qsgd_roundtrip(g, seed=seed)
        assert np.isfinite(decoded).all(), decoded
        assert within_qsgd_bound(g, decoded, 7), (g, decoded)


@QUICK
@given(
    x=hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(-100, 100, width=32)),
    exponent=st.integers(-30, 30),
    levels=st.sampled_from([1, 7, 127]),
)
def test_qsgd_stays_within_its_bound_at_every_scale(x, exponent, levels):
    g = (x.astype(np.float64) * 10.0**exponent).astype(np.float32)
    decoded = qsgd_roundtrip(g, levels=levels)
    assert np.isfinite(decoded).all()
    assert within_qsgd_bound(g, decoded, levels)


def test_qsgd_refuses_a_norm_float32_cannot_hold():
    g = np.array([3e38, -3e38], np.float32)  # each value fits float32, the norm (4.2e38) does not
    with pytest.raises(ValueError, match=r"norm.*float32.*clip"):
        make_compressor("qsgd").compress(g, "big")


def test_sign_scale_of_the_largest_float32_values_is_finite():
    g = np.array([3e38, -3e38, 3e38], np.float32)  # their float32 sum overflows, the mean fits
    comp = make_compressor("sign")
    decoded = comp.decompress(comp.compress(g, "w")[0])
    assert np.isfinite(decoded).all() and np.allclose(decoded, g, rtol=1e-6), decoded


def float16_mean_by_allreduce(grads: list[np.ndarray]) -> np.ndarray:
    """Each rank compresses and prescales, the float16 shares are summed in float16, then decoded.

    The sum runs in float16 in rank order, as an allreduce of float16 buffers adds them.
    """
    comp = make_compressor("float16")
    payloads = [comp.compress(g, "w")[0] for g in grads]
    for p in payloads:
        comp.prescale(p, len(grads))
    total = payloads[0].parts["values"].copy()
    for p in payloads[1:]:
        total += p.parts["values"]
    payloads[0].parts["values"] = total
    return comp.decompress(payloads[0])


def test_float16_mean_of_three_ranks_at_its_largest_value_is_that_value():
    # 65504 / 3 rounds up to 21840, and three of those sum to 65520: past 65504, so inf
    grads = [np.full(4, FLOAT16_MAX, np.float32)] * 3
    mean = float16_mean_by_allreduce(grads)
    assert np.isfinite(mean).all(), mean
    assert np.allclose(mean, FLOAT16_MAX, rtol=3 * 2 * HALF_ULP)
    assert np.all(float16_mean_by_allreduce([-g for g in grads]) == -mean)


@QUICK
@given(
    world_size=st.integers(2, 8),
    data=st.data(),
)
def test_float16_mean_is_finite_and_close_for_every_value_in_range(world_size, data):
    near_edge = st.floats(64864.0, FLOAT16_MAX, width=16)  # the top 1 % of float16
    anywhere = st.floats(-FLOAT16_MAX, FLOAT16_MAX, width=16)
    values = st.one_of(near_edge, near_edge.map(lambda v: -v), anywhere)
    grads = [
        data.draw(hnp.arrays(np.float16, 5, elements=values)).astype(np.float32)
        for _ in range(world_size)
    ]
    mean = float16_mean_by_allreduce(grads)
    want = np.mean(np.stack(grads).astype(np.float64), axis=0)
    biggest = np.max(np.abs(np.stack(grads)), axis=0)
    # each share and each partial sum rounds once: 2N roundings of at most HALF_ULP * biggest
    tolerance = 2 * world_size * HALF_ULP * biggest + world_size * 6e-8
    assert np.isfinite(mean).all(), (grads, mean)
    assert np.all(np.abs(mean - want) <= tolerance), (grads, mean, want)
