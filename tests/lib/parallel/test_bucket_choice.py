"""The bucketed exchange's choice of allreduce: the cost model's crossover, agreement, eager rings;
rings in segments (the buckets' and the ``ring`` exchange's) sum bitwise as in whole chunks.

Threads stand in for ranks here (fast, exact); the choice in a real run on engines is checked in
test_data_parallel.py, where each bucket's bytes must match the algorithm it recorded.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from comm_workers.threads import run_threads

from course_lib.collectives import ring_allreduce
from course_lib.collectives.tree import recursive_doubling_allreduce
from course_lib.comm import CommMismatchError
from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.parallel.exchanges.base import RingAllreduce
from course_lib.parallel.exchanges.bucket_choice import (
    agree_on_layout,
    choose_algorithms,
    measure_path,
)
from course_lib.parallel.exchanges.buckets import BucketedAllreduce

SLOW_STEPS = LinkModel(alpha=1e-3, beta=8e-9)  # 1 ms a step, 125 MB/s


def test_two_ranks_always_double_same_bytes_half_the_steps():
    sizes = [4, 4096, 2**20, 2**28]
    assert choose_algorithms(sizes, 2, "auto", SLOW_STEPS) == ["doubling"] * 4
    assert choose_algorithms(sizes, 2, "auto", LinkModel(alpha=1e-9, beta=1e-6)) == ["doubling"] * 4


def test_four_ranks_switch_to_the_ring_above_eight_alpha_over_beta():
    # ring 6a + 1.5 S b against doubling 2a + 2 S b: equal at S* = 8a/b = 1 MB here
    crossover = 8 * SLOW_STEPS.alpha / SLOW_STEPS.beta
    below, above = int(0.9 * crossover), int(1.1 * crossover)
    assert choose_algorithms([below, above], 4, "auto", SLOW_STEPS) == ["doubling", "ring"]
    fast_steps = LinkModel(alpha=1e-6, beta=8e-9)  # a fast step moves the crossover to 1 kB
    assert choose_algorithms([below], 4, "auto", fast_steps) == ["ring"]


def test_a_ring_in_segments_is_priced_as_it_runs():
    # 2.5 ms a step: whole chunks, the 2.2 MB bucket's six steps cost more than doubling's two
    # whole-buffer steps; in 256 KiB segments the steps overlap and the ring is the cheaper
    busy = LinkModel(alpha=2.5e-3, beta=8e-9)
    assert choose_algorithms([2_200_000, 77_000], 4, "auto", busy) == ["doubling", "doubling"]
    assert choose_algorithms([2_200_000, 77_000], 4, "auto", busy, 1 << 18) == ["ring", "doubling"]
    # on two ranks the ring in segments at best ties doubling's one step: doubling still
    assert choose_algorithms([2_200_000], 2, "auto", busy, 1 << 18) == ["doubling"]
    assert choose_algorithms([2_200_000], 2, "auto", SLOW_STEPS, 1 << 16) == ["doubling"]


def test_a_named_algorithm_is_used_for_every_bucket_and_auto_needs_a_model():
    assert choose_algorithms([1, 2**30], 4, "ring") == ["ring", "ring"]
    assert choose_algorithms([1, 2], 1, "auto") == ["ring", "ring"]
    with pytest.raises(ValueError, match="measure_path"):
        choose_algorithms([1], 4, "auto")
    with pytest.raises(ValueError, match=r"'auto' or one of 'ring', 'doubling', 'builtin'"):
        BucketedAllreduce(algorithm="tree")


def test_ranks_with_different_bucket_layouts_are_refused():
    run_threads(3, lambda c: agree_on_layout(c, [400, 1200]))  # equal: nothing raised
    with pytest.raises(CommMismatchError, match="different layout"):
        run_threads(3, lambda c: agree_on_layout(c, [400, 1200 + 4 * (c.rank == 2)]), timeout=5)
    with pytest.raises(CommMismatchError, match="different layout"):  # same total, other split
        run_threads(2, lambda c: agree_on_layout(c, [400, 1200] if c.rank else [800, 800]))


def test_every_rank_gets_the_same_measured_path():
    models = run_threads(3, measure_path)
    assert models[0].alpha > 0 and models[0].beta > 0
    assert all(m == models[0] for m in models)


@pytest.mark.parametrize("algorithm", [ring_allreduce, recursive_doubling_allreduce])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_eager_receives_give_bitwise_the_same_sum(algorithm, p):
    x = np.random.default_rng(p).standard_normal((p, 1001)).astype(np.float32)
    eager = run_threads(p, lambda c: algorithm(c, x[c.rank].copy(), eager=True))
    plain = run_threads(p, lambda c: algorithm(c, x[c.rank].copy()))
    for got, want in zip(eager, plain, strict=True):
        assert np.array_equal(got, want)
    assert np.allclose(eager[0], x.sum(0), atol=1e-5)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_a_bucket_in_segments_sums_bitwise_as_in_whole_chunks(p):
    x = np.random.default_rng(p).standard_normal((p, 30_001)).astype(np.float32)

    def bucket(c, segment_bytes):  # one bucket's allreduce, as the communication thread runs it
        exchange = BucketedAllreduce(algorithm="ring", segment_bytes=segment_bytes)
        exchange.comm, exchange._algorithm_now = c, "ring"
        flat = torch.from_numpy(x[c.rank].copy())
        exchange._allreduce(flat)
        return flat.numpy(), c.stats.messages_sent, exchange._segments(flat.numpy())

    whole = run_threads(p, lambda c: bucket(c, None))
    pieces = run_threads(p, lambda c: bucket(c, 4096))
    for (got, sent, segments), (want, sent_whole, one) in zip(pieces, whole, strict=True):
        assert np.array_equal(got, want)
        assert one == 1 and segments == math.ceil(math.ceil(30_001 / p) * 4 / 4096) > 1
        assert (sent, sent_whole) == (2 * (p - 1) * segments, 2 * (p - 1))
    assert np.allclose(whole[0][0], x.mean(0), atol=1e-5)


def test_the_ring_exchange_in_segments_averages_bitwise_as_in_whole_chunks():
    p, x = 4, np.random.default_rng(7).standard_normal((4, 30_001)).astype(np.float32)

    def average(c, segment_bytes):
        flat = x[c.rank].copy()
        RingAllreduce(segment_bytes).average(c, flat)
        return flat, c.stats.messages_sent

    whole, pieces = (run_threads(p, lambda c, s=s: average(c, s)) for s in (None, 4096))
    for (got, sent), (want, sent_whole) in zip(pieces, whole, strict=True):
        assert np.array_equal(got, want)
        assert sent > sent_whole  # it did travel in segments
    with pytest.raises(ValueError, match="segment_bytes must be None or >= 1"):
        RingAllreduce(0)
