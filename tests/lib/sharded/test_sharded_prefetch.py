"""Lecture 11's stage 3 with prefetching (FSDP's forward and backward prefetch) on real engines.

Every collective of a step runs on one communication thread; from the second step on, the
allgather of the next module's unit is queued when a module's unit is needed. Checked here:
the weights are bitwise those of the naive schedule (``prefetch=False``), the order of events
(numbered on both threads, never timed) shows the next unit's allgather issued before this
module's forward has ended, and a failure on the communication thread surfaces on the training
thread as an error naming the rank, not as a hang.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from test_sharded import ADAM, DP_RTOL, TiedFrozen, relative_error, small_digits, uneven_mlp

from course_lib.parallel.data_parallel.reference import train_one_process
from course_lib.parallel.data_parallel.train import DataParallelError, train_data_parallel
from course_lib.parallel.sharded import Zero3
from course_lib.parallel.sharded.audit import audit_bytes
from course_lib.parallel.sharded.fsdp_unit import QUEUED_REDUCE_SCATTERS
from course_lib.parallel.sharded.units import plan_units, root_unit, unit_sizes

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def pool(shared_engines):
    return shared_engines(4)  # from the session's pool (tests/conftest.py)


def _run(pool, method, n: int, model=uneven_mlp, **kwargs: Any):
    return train_data_parallel(
        pool,
        model=model,
        dataset=small_digits,
        config=ADAM,
        method=method,
        world_size=n,
        comm_timeout=30,
        timeout=300,
        **kwargs,
    )


@pytest.fixture(scope="module")
def runs(pool):
    """``runs(prefetch, n, model)``: one run each, made once."""
    done = {}

    def run(prefetch: bool, n: int, model=uneven_mlp):
        key = (prefetch, n, model.__name__)
        if key not in done:
            done[key] = _run(pool, Zero3(1024, prefetch=prefetch), n, model)
        return done[key]

    return run


def test_the_registered_stage_3_prefetches():
    assert Zero3().prefetch and not Zero3(prefetch=False).prefetch
    with pytest.raises(ValueError, match="prefetch must be True or False"):
        Zero3(prefetch="yes")


@pytest.mark.parametrize("n, model", [(3, uneven_mlp), (4, uneven_mlp), (3, TiedFrozen)])
def test_prefetching_gives_bitwise_the_weights_of_the_naive_schedule(runs, n, model):
    # The same collectives on the same buffers, only issued earlier: the same bits.
    inline, prefetched = runs(False, n, model), runs(True, n, model)
    assert prefetched.replicas_equal and inline.replicas_equal
    assert list(prefetched.weights) == list(inline.weights)
    for name, want in inline.weights.items():
        assert np.array_equal(prefetched.weights[name], want), name


def _forward_order(record: dict[str, Any]) -> list[int]:
    return [e["group"] for e in record["events"] if e["kind"] == "forward"]


def _issued(record: dict[str, Any], unit: int, why: str) -> int:
    (event,) = [
        e
        for e in record["events"]
        if e["kind"] == "allgather" and e["unit"] == unit and e["for"] == why
    ]
    return event["issued"]


def _late_records(result) -> list[dict[str, Any]]:
    records = [r for r in result.records if r["step"] >= 1]  # step 0 records the order
    assert len(records) == 3 * 3
    return records


def test_the_next_units_allgather_is_issued_before_this_modules_forward_ends(runs):
    # uneven_mlp: modules 1, 3, 5 hold units 0, 1, 2 (one each), run forward in that order and
    # backward in reverse. Numbers from one sequence shared by both threads order the events.
    for rec in _late_records(runs(True, 3)):
        assert _forward_order(rec) == [0, 1, 2]
        ends = {e["group"]: e["end"] for e in rec["events"] if e["kind"] == "forward_end"}
        scatters = {e["unit"]: e["issued"] for e in rec["events"] if e["kind"] == "reduce_scatter"}
        for k in (0, 1):  # forward: unit k+1 is on its way while unit k computes
            assert _issued(rec, k + 1, "forward") < ends[k], (rec["rank"], rec["step"], k)
        for k in (2, 1):  # backward: unit k-1 is queued before unit k's gradients are ready
            assert _issued(rec, k - 1, "backward") < scatters[k], (rec["rank"], rec["step"], k)
        prefetched = [e["unit"] for e in rec["events"] if e.get("prefetch")]
        assert prefetched == [1, 2, 1, 0]  # depth 1: the first unit of each pass is not
        # the queue is one FIFO: the thread starts jobs in the order they were issued
        jobs = sorted((e for e in rec["events"] if "issued" in e), key=lambda e: e["issued"])
        assert [e["start"] for e in jobs] == sorted(e["start"] for e in jobs)


def test_the_step_picture_shows_every_collective_and_the_spread_is_per_collective(runs):
    from matplotlib.colors import to_hex

    from course_lib.parallel.sharded.unit_timeline import (
        KIND_COLORS,
        collective_spread,
        plot_unit_timeline,
    )

    result = runs(True, 3)
    fig = plot_unit_timeline(result.records, 2)
    queue = {to_hex(c) for c in KIND_COLORS.values()}
    bars = [to_hex(p.get_facecolor()) for p in fig.axes[0].patches]
    assert sum(c in queue for c in bars) == 3 * 9  # each rank's 9 collectives, one bar each
    assert len(bars) - 3 * 9 >= 3 * 3  # forward, backward, optimiser step at least, per rank
    rows = collective_spread(result.records)
    assert [r["collective"] for r in rows] == [
        "allgather forward u0", "allgather forward u1", "allgather forward u2",
        "allgather backward u2", "allgather backward u1", "reduce_scatter u2",
        "allgather backward u0", "reduce_scatter u1", "reduce_scatter u0",
    ]  # fmt: skip
    assert all(r["start_spread_ms"] >= 0 for r in rows)
    with pytest.raises(ValueError, match="no stage-3 collectives"):
        plot_unit_timeline([{**r, "events": []} for r in result.records], 2)


def test_the_naive_schedule_issues_each_allgather_after_the_previous_forward(runs):
    # The counter-example the test above rules out: without prefetching, unit k+1 is asked for
    # only by its own module's pre-hook, after module k's forward has ended.
    for rec in _late_records(runs(False, 3)):
        ends = {e["group"]: e["end"] for e in rec["events"] if e["kind"] == "forward_end"}
        for k in (0, 1):
            assert _issued(rec, k + 1, "forward") > ends[k]
        assert not any(e.get("prefetch") for e in rec["events"])


@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetching_holds_at_most_the_current_and_the_next_unit(pool, prefetch):
    # Eight hidden layers of 64: units of 4 160 values but the last (650). Counted where units
    # are requested (the training thread's bookkeeping, not a timing): gathered or on their way
    # at once, the current module's and (prefetching, from step 1) the next one's.
    from course_lib.training.models import MLP

    def deep():
        return MLP(64, (64,) * 8)

    result = _run(pool, Zero3(prefetch=prefetch), 4, model=deep)
    for rec in result.records:
        want = 2 if prefetch and rec["step"] >= 1 else 1
        assert rec["zero3_units_held_peak"] == want, (rec["rank"], rec["step"])
        # reduce-scatters queued and not yet waited for (each holds a unit's gradients): at
        # most QUEUED_REDUCE_SCATTERS, where without the bound all nine would be by the end
        queued = QUEUED_REDUCE_SCATTERS if prefetch else 1
        assert rec["zero3_reduce_scatters_queued_peak"] == queued, (rec["rank"], rec["step"])
        if rec["step"] == 0:
            continue  # Adam's state is made by step 0's optimiser step
        # ... and the ledger counts them: over the shards and Adam's state, at least one unit
        # and its gradients (backward), at most three units (the current one, its gradients,
        # the next one) and the shards' gradients
        unit = 4 * 4160
        extra = rec["ledger_in_flight_bytes"] - rec["ledger_params_bytes"]
        extra -= rec["ledger_optimizer_bytes"]
        assert 2 * unit <= extra <= want * unit + unit + rec["ledger_grads_bytes"], extra / unit
        # the exchange's own buffers: receive buffers of the units on their way (at most 2) and
        # the gradients of the reduce-scatters queued (at most QUEUED_REDUCE_SCATTERS)
        most = (want + (QUEUED_REDUCE_SCATTERS if prefetch else 0)) * unit
        assert unit <= rec["ledger_comm_bytes"] <= most, rec["ledger_comm_bytes"] / unit


def test_a_minimum_unit_size_puts_the_small_modules_in_the_root_unit(pool):
    # FSDP's size-based wrapping policy: modules '3' (240 values) and '5' (160) are under 300,
    # so they join the root's unit (gathered once per step), module '1' (975) stays a unit.
    with pytest.raises(ValueError, match="segment_bytes must be None or >= 1"):
        Zero3(segment_bytes=0)
    n, least = 2, 300
    units = plan_units(uneven_mlp(), 3, n, min_unit=least)
    assert [u.names for u in units] == [["3.weight", "3.bias", "5.weight", "5.bias"],
                                        ["1.weight", "1.bias"]]  # fmt: skip
    assert root_unit(uneven_mlp(), 3, least) and not root_unit(uneven_mlp(), 3)
    with pytest.raises(ValueError, match="min_unit must be a whole number"):
        Zero3(min_unit=-1)
    # prefetching, in 64-byte segments (pipelined), against the naive schedule's whole chunks
    wrapped = {
        p: _run(pool, Zero3(1024, prefetch=p, min_unit=least, segment_bytes=64 if p else None), n)
        for p in (True, False)
    }
    zero0 = _run(pool, "zero0", n).weights
    for prefetch, result in wrapped.items():
        assert result.replicas_equal
        # two ranks: one addition per value, so bitwise data parallelism's result
        assert relative_error(result.weights, zero0) == 0.0, prefetch
        sizes = unit_sizes(uneven_mlp(), 3, n, min_unit=least)
        rows = audit_bytes(result.records, 3, sizes, n, root=True)  # the root's travels twice
        assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
        for rec in result.records:
            gathers = [e["unit"] for e in rec["events"] if e["kind"] == "allgather"]
            assert sorted(gathers) == [0, 1, 1], (prefetch, rec["step"], gathers)
    assert (
        relative_error(wrapped[True].weights, train_one_process(uneven_mlp, small_digits, ADAM))
        <= DP_RTOL
    )


def test_keeping_the_last_unit_gathered_into_backward_saves_its_second_allgather(pool, runs):
    # torchtitan's reshard_after_forward=False on the last block: module '5' (unit 2, the last
    # forward runs) stays gathered for backward, which starts with it; the values are the same
    with pytest.raises(ValueError, match="keep_last must be True or False"):
        Zero3(keep_last=1)
    n = 3
    kept = _run(pool, Zero3(1024, keep_last=True), n)
    assert kept.replicas_equal
    assert relative_error(kept.weights, runs(False, n).weights) == 0.0  # the naive schedule's
    sizes = unit_sizes(uneven_mlp(), 3, n)
    assert [r.get("zero3_kept_values", 0) for r in kept.records if r["rank"] == 0] == [
        0,  # the first step records the order of the modules
        *[sizes[2]] * (len(kept.records) // n - 1),
    ]
    rows = audit_bytes(kept.records, 3, sizes, n, kept=2)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    with pytest.raises(ValueError, match="pass kept="):
        audit_bytes(kept.records, 3, sizes, n)
    prefetched = runs(True, n)
    for rec, other in zip(kept.records, prefetched.records, strict=True):
        gathers = sorted(e["unit"] for e in rec["events"] if e["kind"] == "allgather")
        assert gathers == ([0, 0, 1, 1, 2, 2] if rec["step"] == 0 else [0, 0, 1, 1, 2]), gathers
        assert rec["zero3_units_held_peak"] <= other["zero3_units_held_peak"]


class FailsOnRank1(Zero3):
    """Stage 3 whose communication thread fails on rank 1 at its 11th job: step 1's prefetch of
    the second unit (step 0 ran 9 jobs: 3 allgathers forward, 3 back, 3 reduce-scatters)."""

    def attach(self, comm, net):
        net = super().attach(comm, net)
        submit, count = self.thread.submit, itertools.count()

        def submit_or_fail(fn, label):
            if comm.rank == 1 and next(count) == 10:

                def fn():
                    raise OSError("injected: the link went down")

            return submit(fn, label)

        self.thread.submit = submit_or_fail
        return net


def test_a_failure_on_the_communication_thread_names_the_rank_and_does_not_hang(pool):
    with pytest.raises(DataParallelError) as info:
        train_data_parallel(
            pool,
            model=uneven_mlp,
            dataset=small_digits,
            config=ADAM,
            method=FailsOnRank1(1024),
            world_size=3,
            comm_timeout=5,  # the other ranks' threads give up on rank 1 after 5 s
            timeout=120,  # a hang would be reported as one after 120 s (not matched below)
        )
    text = str(info.value)
    assert (
        "rank 1: the allgather of unit module '3' failed on the communication thread: "
        "OSError: injected: the link went down" in text
    ), text
    assert "hung" not in text, text
