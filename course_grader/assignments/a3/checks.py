"""Checks of assignment A3 (data parallelism: a sharded parameter server's averaging, bucketed allreduce).

The student's averaging functions plug into the kit's data-parallel seam and run on 4 engines
(:mod:`course_grader.assignments.a3.engine`: the answer plugged in as an exchange, the
probe's call, the training run; judged by :mod:`course_grader.assignments.a3.judge`, which
the grader also runs in its own process on a graded kernel's data,
:mod:`course_grader.assignments.a3.probe`). Each engine check has two parts. A **probe** calls the
function once on every rank with known integer-valued gradients and reads the communicator's counters: no built-in
collective, who talked to whom, and how many bytes; it names the usual mistakes, source 000's
published one above all. Then a **training run** of 2 epochs (10 steps) on 4 engines must leave
every replica equal to one process trained on the whole global batch and move the method's bytes
in every step. The bucket layout (A3.2) is checked in the notebook against DDP's rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_grader.assignments.a3.engine import (
    BUCKET_METHOD,
    COMM_TIMEOUT,
    PS_METHOD,
    A3Net,
    a3net_sizes,
    check_digits,
    connect,
    fail_fast_on_stub,
    raise_run_failure,
)
from course_grader.assignments.a3.engine import prepare_engines as _prepare_engines
from course_grader.assignments.a3.judge import (
    probe,
    reference_layout,
    reference_weights,
    ring_bytes_bounds,
    train_and_compare,
)
from course_lib.checks.verdict import Verdict, run_check
from course_lib.i18n import _

__all__ = ["A3_POINTS", "BAD_BUCKET_BYTES", "BUCKET_BYTES", "BUCKET_METHOD", "PROBE_SIZES",
           "PS_CASES", "PS_METHOD", "TRAIN_SERVER", "A3Net", "bucket_detail",
           "check_bucket_average", "check_bucket_layout", "check_digits",
           "check_parameter_server", "judge_bad_size", "judge_layout", "layout_cases",
           "layout_detail", "prepare_engines", "ps_detail", "ring_bytes_bounds"]  # fmt: skip

A3_POINTS = {"A3.1": 3.0, "A3.2": 2.0, "A3.3": 5.0}
TRAIN_SERVER = 1  # not rank 0: an answer that hard-codes the server fails
BUCKET_BYTES = 128  # 32 floats: the network's 599 trainable values make 3 uneven buckets
PROBE_SIZES = (1, 3, 10, 599, 1001)  # smaller than the world size, uneven, prime
PS_CASES = [(size, server) for size in (1, 10, 599) for server in (0, 3)]  # (size, server)
BAD_BUCKET_BYTES = (0, -4)


def prepare_engines(cluster: Any) -> None:
    """Give 4 engines the checks' communicator and the training code (slow once: a set-up cell)."""
    _prepare_engines(cluster)
    reference_weights()  # the one-process run the checks compare with, once


def _engine_check(kind: str, fn: Callable, cluster: Any, cases: list, options: dict) -> str:
    from course_lib.parallel.data_parallel.engines import (
        COMM_NAME,
        DataParallelError,
        run_on_engines,
    )

    fail_fast_on_stub(fn, *([0] if kind == "ps" else []))
    ids = connect(cluster)  # nothing to do when the set-up cell did it
    for size, server in cases:
        try:  # a hang is recovered and a dead engine named, never a stuck check cell
            reasons = run_on_engines(
                cluster, ids, probe, (kind, fn, size, server, COMM_NAME), COMM_TIMEOUT + 40
            )
        except DataParallelError as exc:
            raise_run_failure(exc)
        for why in reasons:
            assert not why, why
    return str(train_and_compare(cluster, kind, fn, **options))


# ---- A3.1 --------------------------------------------------------------------------------------
def ps_detail(steps: int) -> str:
    """What A3.1's PASS says (the notebook's check and the grader's say the same)."""
    return _(
        "4 ranks, shard 0 served by rank 0 and by rank 3: the mean, every rank its part of each "
        "shard and its own shard's mean, no server link carrying (N-1)S; {steps} training steps "
        "with shard 0 on rank {server} equal to one process"
    ).format(steps=steps, server=TRAIN_SERVER)


def check_parameter_server(fn: Callable, cluster: Any, *, verbose: bool = True) -> Verdict:
    """A3.1: ``fn(comm, flat, server)``: the mean over ranks, each shard averaged by its own server."""

    def body() -> str:
        return ps_detail(_engine_check("ps", fn, cluster, PS_CASES, {"server": TRAIN_SERVER}))

    return run_check("A3.1", "ps_average", body, max_points=A3_POINTS["A3.1"], verbose=verbose)


# ---- A3.2 --------------------------------------------------------------------------------------
def layout_cases(seed: int | None = None) -> list[tuple[list[int], int]]:
    """The layouts A3.2 is checked on; ``seed`` (the grader's) changes the three random ones."""
    rng = np.random.default_rng(32 if seed is None else [seed, 32])
    random = [(list(rng.integers(1, 60, k)), int(rng.integers(4, 200))) for k in (5, 9, 14)]
    return [
        (a3net_sizes(), BUCKET_BYTES),
        ([4, 4, 4, 4], 32),
        ([100, 3, 2], 16),
        ([7], 1 << 20),
        ([3, 5, 8], 1 << 20),
        ([], 64),
    ] + random


def judge_bad_size(bad: int, raised_value_error: bool) -> None:
    """Raise AssertionError unless ``bucket_bytes=bad`` raised ValueError."""
    if not raised_value_error:
        raise AssertionError(
            _("bucket_bytes={bad} must raise ValueError (a bucket holds bytes)").format(bad=bad)
        )


def judge_layout(sizes: list[int], cap: int, got: list[list[int]] | None) -> None:
    """Raise AssertionError, naming the mistake, unless ``got`` is DDP's layout of ``sizes``."""
    want = reference_layout(sizes, cap)
    if got == want:
        return
    case = _("sizes {sizes}, bucket_bytes {cap}: got {got}, want {want}").format(
        sizes=[int(s) for s in sizes], cap=cap, got=got, want=want
    )
    if got is not None and sorted(i for b in got for i in b) != list(range(len(sizes))):
        raise AssertionError(
            _("{case}; every parameter belongs to exactly one bucket").format(case=case)
        )
    forward = reference_layout(sizes[::-1], cap)  # the same rule, first to last
    if got == [[len(sizes) - 1 - i for i in b] for b in forward]:
        raise AssertionError(
            _(
                "{case}; start from the last parameter: backward produces "
                "the last layer's gradients first"
            ).format(case=case)
        )
    raise AssertionError(
        _("{case}; a bucket closes as soon as it holds >= bucket_bytes bytes (4 per value)").format(
            case=case
        )
    )


def layout_detail(num_cases: int) -> str:
    """What A3.2's PASS says."""
    return _("{n} layouts equal to DDP's rule, reverse order, bad sizes refused").format(
        n=num_cases
    )


def _layout_body(fn: Callable) -> str:
    for bad in BAD_BUCKET_BYTES:
        try:
            fn([3, 4], bad)
        except ValueError:
            judge_bad_size(bad, True)
        else:
            judge_bad_size(bad, False)
    cases = layout_cases()
    for sizes, cap in cases:
        got = fn([int(s) for s in sizes], cap)
        judge_layout(sizes, cap, [[int(i) for i in b] for b in got] if got is not None else None)
    return layout_detail(len(cases))


def check_bucket_layout(fn: Callable, *, verbose: bool = True) -> Verdict:
    """A3.2: ``fn(sizes, bucket_bytes)`` returns DDP's buckets of parameter indices."""
    return run_check(
        "A3.2",
        "bucket_layout",
        lambda: _layout_body(fn),
        max_points=A3_POINTS["A3.2"],
        verbose=verbose,
    )


# ---- A3.3 --------------------------------------------------------------------------------------
def bucket_detail(steps: int) -> str:
    """What A3.3's PASS says."""
    return _(
        "4 ranks, {sizes} sizes: the mean, ring partners, 2(N-1)/N of the "
        "bucket; {steps} training steps in 3 overlapped buckets equal to one process"
    ).format(sizes=len(PROBE_SIZES), steps=steps)


def check_bucket_average(fn: Callable, cluster: Any, *, verbose: bool = True) -> Verdict:
    """A3.3: ``fn(comm, flat)`` averages one bucket by a ring, inside the bucketed exchange."""
    cases = [(size, 0) for size in PROBE_SIZES]

    def body() -> str:
        steps = _engine_check("bucket", fn, cluster, cases, {"bucket_bytes": BUCKET_BYTES})
        return bucket_detail(steps)

    return run_check("A3.3", "bucket_average", body, max_points=A3_POINTS["A3.3"], verbose=verbose)
