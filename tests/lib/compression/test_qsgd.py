"""QSGD as Alistarh et al. (2017) define it (issue 23, item 4): buckets, packed levels, the bound.

The vector is cut into buckets of d values (default 512), each with its own float32 norm; each
value travels as a sign and a level in 0..s packed in ceil(log2(2s+1)) bits (4 at s = 7: source
001's "32 -> 4 bits"). Checked here: the bytes on the wire equal that formula, levels survive
packing exactly, the decoded gradient is unbiased, and its measured variance matches the exact
one and stays under min(d/s^2, sqrt(d)/s) ||g_b||^2 summed over buckets. Fixed seeds: no flakes.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.compression import PayloadError, make_compressor, pack, unpack
from course_lib.compression.stochastic import (
    pack_levels,
    qsgd_bits,
    qsgd_variance_bound,
    unpack_levels,
)

QUICK = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def qsgd(**kw):
    return make_compressor("qsgd", **kw)


def decode_once(comp, g):
    return comp.decompress(comp.compress(g, "g")[0]).astype(np.float64)


def test_bits_per_value_are_ceil_log2_of_2s_plus_1():
    assert [qsgd_bits(s) for s in (1, 2, 3, 4, 7, 8, 15, 16, 63, 64, 127)] == [
        2, 3, 3, 4, 4, 5, 5, 6, 7, 8, 8,
    ]  # fmt: skip
    assert qsgd().bits == 4  # the default s = 7: 32 -> 4 bits, as source 001 cites


@pytest.mark.parametrize("levels", [1, 3, 7, 15, 127])
@pytest.mark.parametrize("bucket", [1, 64, 512])
@pytest.mark.parametrize("n", [0, 1, 7, 511, 512, 513, 3001])
def test_packed_bytes_equal_the_formula(levels, bucket, n):
    g = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    payload, _ = qsgd(levels=levels, bucket=bucket).compress(g, "g")
    bits = math.ceil(math.log2(2 * levels + 1))
    want = math.ceil(n * bits / 8) + 4 * math.ceil(n / bucket)
    assert payload.nbytes == want
    assert payload.parts["norm"].dtype == np.float32
    assert payload.parts["norm"].size == math.ceil(n / bucket)
    frame = pack(payload)  # the frame adds its header and two CRC32s, nothing else
    (header,) = struct.unpack_from("<I", frame, 5)
    assert len(frame) == 9 + header + 4 + want + 4


def test_default_qsgd_sends_4_bits_a_value_and_a_norm_per_512():
    n = 512 * 64
    payload, _ = qsgd().compress(np.ones(n, np.float32), "g")
    assert payload.nbytes == n // 2 + 4 * 64  # 8x fewer bytes than float32, less 64 norms


@QUICK
@given(
    levels=st.integers(1, 127),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**16),
)
def test_levels_round_trip_exactly_through_the_packing(levels, n, seed):
    q = np.random.default_rng(seed).integers(-levels, levels + 1, n).astype(np.int8)
    q[: min(n, 2)] = [-levels, levels][: min(n, 2)]  # the extreme codes 0 and 2s
    packed = pack_levels(q, levels)
    assert packed.dtype == np.uint8 and packed.size == math.ceil(n * qsgd_bits(levels) / 8)
    assert np.array_equal(unpack_levels(packed, n, levels), q)


@pytest.mark.parametrize("levels", [1, 7, 127])
def test_decode_of_encode_gives_back_the_levels_and_their_values(levels):
    g = (np.random.default_rng(4).standard_normal(1300) ** 3).astype(np.float32)
    a, b = qsgd(levels=levels, bucket=100, seed=3), qsgd(levels=levels, bucket=100, seed=3)
    q, norms = a.levels_of(g)
    payload = unpack(pack(b.compress(g, "g")[0]))[0]  # through the wire format
    assert np.array_equal(b.decode_levels(payload), q)
    assert np.array_equal(payload.parts["norm"], norms)
    want = q.astype(np.float32) * np.repeat(norms / np.float32(levels), 100)[: g.size]
    assert np.array_equal(b.decompress(payload), want)
    assert np.all(np.abs(q) <= levels)


def test_norms_are_per_bucket_computed_in_float64():
    g = np.concatenate([np.full(4, 1e20), np.full(4, 1e-23), np.zeros(4)]).astype(np.float32)
    payload, _ = qsgd(bucket=4).compress(g, "g")
    want = [np.float32(np.linalg.norm(g[i : i + 4].astype(np.float64))) for i in (0, 4, 8)]
    assert np.array_equal(payload.parts["norm"], want) and want[1] > 0


def test_a_small_bucket_is_not_drowned_by_a_large_one():
    # a whole-vector norm would give the small values an error up to 1e4 / s
    g = np.concatenate([np.full(512, 1e4), np.linspace(-1, 1, 512)]).astype(np.float32)
    for seed in range(5):
        decoded = decode_once(qsgd(seed=seed), g)
        small = np.linalg.norm(g[512:].astype(np.float64))
        assert np.all(np.abs(decoded[512:] - g[512:]) <= small / 7 * (1 + 1e-6))
        # ~27 % of them reach a level of their own bucket; under 1e4's norm almost none would
        assert np.count_nonzero(decoded[512:]) >= 50


def test_receiver_with_other_settings_or_a_corrupt_code_is_an_error():
    g = np.random.default_rng(5).standard_normal(100).astype(np.float32)
    payload, _ = qsgd(levels=7, bucket=32).compress(g, "g")
    with pytest.raises(PayloadError, match="bucket=64"):
        qsgd(levels=7, bucket=64).decompress(payload)
    with pytest.raises(PayloadError, match="levels=1"):
        qsgd(levels=1, bucket=32).decompress(payload)
    payload.parts["q"] = payload.parts["q"].copy()
    payload.parts["q"][0] = 0xFF  # code 15 > 2s = 14
    with pytest.raises(PayloadError, match="code above 14"):
        qsgd(levels=7, bucket=32).decompress(payload)


def draws_of(comp, g, draws):
    return np.stack([decode_once(comp, g) for _ in range(draws)])


@pytest.mark.parametrize(("levels", "bucket"), [(1, 32), (7, 32), (4, 40)])
def test_qsgd_is_unbiased_in_every_bucket(levels, bucket):
    g = np.random.default_rng(1).standard_normal(160).astype(np.float32)
    g[bucket : 2 * bucket] *= 1e-3  # a quiet bucket: its own norm keeps its values resolved
    draws = 3000
    mean = draws_of(qsgd(levels=levels, bucket=bucket, seed=7), g, draws).mean(axis=0)
    norms = np.repeat(
        [np.linalg.norm(g[i : i + bucket]) for i in range(0, g.size, bucket)], bucket
    )[: g.size]
    # one value's variance is p (1 - p) (norm_b / s)^2 <= (norm_b / s)^2 / 4
    stderr = norms / levels / 2 / np.sqrt(draws)
    assert np.all(np.abs(mean - g) <= 6 * stderr), np.max(np.abs(mean - g) / stderr)


def exact_variance(g, levels, bucket):
    """E||g^ - g||^2 = sum_i (norm_b / s)^2 p_i (1 - p_i), p_i the fraction past the lower level."""
    total = 0.0
    for i in range(0, g.size, bucket):
        b = g[i : i + bucket].astype(np.float64)
        norm = np.linalg.norm(b)
        if norm:
            r = np.abs(b) / norm * levels
            p = r - np.floor(r)
            total += (norm / levels) ** 2 * float(np.sum(p * (1 - p)))
    return total


@pytest.mark.parametrize(
    ("n", "levels", "bucket"),
    [(4096, 7, 512), (4096, 1, 512), (512, 7, 16), (512, 15, 64)],  # sqrt(d)/s and d/s^2 branches
)
def test_measured_variance_is_the_exact_one_and_under_the_bound(n, levels, bucket):
    g = np.random.default_rng(n + levels).standard_normal(n).astype(np.float32)
    draws = 400
    errors = ((draws_of(qsgd(levels=levels, bucket=bucket, seed=2), g, draws) - g) ** 2).sum(1)
    measured, stderr = errors.mean(), errors.std() / np.sqrt(draws)
    exact = exact_variance(g, levels, bucket)
    bound = qsgd_variance_bound(g, levels, bucket)
    want_bound = sum(
        min(bucket / levels**2, math.sqrt(bucket) / levels)
        * float(np.sum(g[i : i + bucket].astype(np.float64) ** 2))
        for i in range(0, n, bucket)
    )
    assert bound == pytest.approx(want_bound, rel=1e-12)
    assert abs(measured - exact) <= 6 * stderr, (measured, exact, stderr)
    assert exact <= bound and measured <= bound, (measured, exact, bound)
