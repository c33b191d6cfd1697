"""Checks of assignment A3 (data parallelism: the parameter server's averaging, bucketed allreduce).

The student's averaging functions plug into the kit's data-parallel seam and run on 4 engines
(:mod:`course_lib.checks.assignments.a3_engine`: the answer registered as an exchange method, the probe, the
training run). Each engine check has two parts. A **probe** calls the function once on every
rank with known integer-valued gradients and reads the communicator's counters: no built-in
collective, who talked to whom, and how many bytes; it names the usual mistakes, source 000's
published one above all. Then a **training run** of 2 epochs (10 steps) on 4 engines must leave
every replica equal to one process trained on the whole global batch and move the method's bytes
in every step. The bucket layout (A3.2) is checked in the notebook against DDP's rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.checks.assignments.a3_engine import (
    BUCKET_METHOD,
    COMM_TIMEOUT,
    PS_METHOD,
    A3Net,
    a3net_sizes,
    check_digits,
    probe,
    raise_run_failure,
    reference_layout,
    reference_weights,
    ring_bytes_bounds,
    train_and_compare,
)
from course_lib.checks.verdict import Verdict, run_check

__all__ = ["A3_POINTS", "BUCKET_METHOD", "PS_METHOD", "A3Net", "check_bucket_average",
           "check_bucket_layout", "check_digits", "check_parameter_server", "prepare_engines",
           "ring_bytes_bounds"]  # fmt: skip

A3_POINTS = {"A3.1": 3.0, "A3.2": 2.0, "A3.3": 5.0}
TRAIN_SERVER = 1  # not rank 0: an answer that hard-codes the server fails
BUCKET_BYTES = 128  # 32 floats: the network's 599 trainable values make 3 uneven buckets
PROBE_SIZES = (1, 3, 10, 599, 1001)  # smaller than the world size, uneven, prime


def _fail_fast_on_stub(fn: Callable, *args: Any) -> None:
    """Raise a stub's NotImplementedError here, before any engine is busy; else do nothing."""
    try:
        fn(None, np.zeros(3, np.float32), *args)  # no communicator: a real answer stops at once
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - a real answer uses comm: the engines will judge it
        pass


def _connect(cluster: Any) -> list[int]:
    """Make sure the first 4 engines have the checks' communicator; return their ids."""
    from course_lib.parallel.data_parallel.engines import ensure_communicators, select_engines

    assert cluster.world_size >= 4, f"A3 needs 4 engines, not {cluster.world_size}"
    ids = select_engines(cluster, 4)
    ensure_communicators(cluster, ids, "gloo", None, COMM_TIMEOUT)  # the runs' own dp_comm
    return ids


def prepare_engines(cluster: Any) -> None:
    """Give 4 engines the checks' communicator and the training code (slow once: a set-up cell)."""
    ids = _connect(cluster)
    # Load what a run needs once, here, so that the first check cell is not the slow one.
    warm_up = (
        "import course_lib.parallel.exchanges.registry, course_lib.parallel.data_parallel.replica"
    )
    cluster.client[ids].execute(
        f"{warm_up}; from course_lib.checks.assignments.a3 import check_digits; check_digits()",
        block=True,
    )
    reference_weights()


def _engine_check(kind: str, fn: Callable, cluster: Any, cases: list, options: dict) -> str:
    from course_lib.parallel.data_parallel.engines import (
        COMM_NAME,
        DataParallelError,
        run_on_engines,
    )

    _fail_fast_on_stub(fn, *([0] if kind == "ps" else []))
    ids = _connect(cluster)  # nothing to do when the set-up cell did it
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
def check_parameter_server(fn: Callable, cluster: Any, *, verbose: bool = True) -> Verdict:
    """A3.1: ``fn(comm, flat, server)`` leaves in ``flat`` the mean over ranks, via ``server``."""
    cases = [(size, server) for size in (1, 10, 599) for server in (0, 3)]

    def body() -> str:
        steps = _engine_check("ps", fn, cluster, cases, {"server": TRAIN_SERVER})
        return (
            f"4 ranks, servers 0 and 3: the mean, server (N-1)S each way, workers S; "
            f"{steps} training steps with server rank {TRAIN_SERVER} equal to one process"
        )

    return run_check("A3.1", "ps_average", body, max_points=A3_POINTS["A3.1"], verbose=verbose)


# ---- A3.2 --------------------------------------------------------------------------------------
def _layout_cases() -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(32)
    random = [(list(rng.integers(1, 60, k)), int(rng.integers(4, 200))) for k in (5, 9, 14)]
    return [
        (a3net_sizes(), BUCKET_BYTES),
        ([4, 4, 4, 4], 32),
        ([100, 3, 2], 16),
        ([7], 1 << 20),
        ([3, 5, 8], 1 << 20),
        ([], 64),
    ] + random


def _layout_body(fn: Callable) -> str:
    for bad in (0, -4):
        try:
            fn([3, 4], bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"bucket_bytes={bad} must raise ValueError (a bucket holds bytes)")
    cases = _layout_cases()
    for sizes, cap in cases:
        want = reference_layout(sizes, cap)
        got = fn([int(s) for s in sizes], cap)
        got = [[int(i) for i in b] for b in got] if got is not None else None
        if got == want:
            continue
        case = f"sizes {[int(s) for s in sizes]}, bucket_bytes {cap}: got {got}, want {want}"
        if got is not None and sorted(i for b in got for i in b) != list(range(len(sizes))):
            raise AssertionError(f"{case}; every parameter belongs to exactly one bucket")
        forward = reference_layout(sizes[::-1], cap)  # the same rule, first to last
        if got == [[len(sizes) - 1 - i for i in b] for b in forward]:
            raise AssertionError(
                f"{case}; start from the last parameter: backward produces "
                "the last layer's gradients first"
            )
        raise AssertionError(
            f"{case}; a bucket closes as soon as it holds >= bucket_bytes bytes (4 per value)"
        )
    return f"{len(cases)} layouts equal to DDP's rule, reverse order, bad sizes refused"


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
def check_bucket_average(fn: Callable, cluster: Any, *, verbose: bool = True) -> Verdict:
    """A3.3: ``fn(comm, flat)`` averages one bucket by a ring, inside the bucketed exchange."""
    cases = [(size, 0) for size in PROBE_SIZES]

    def body() -> str:
        steps = _engine_check("bucket", fn, cluster, cases, {"bucket_bytes": BUCKET_BYTES})
        return (
            f"4 ranks, {len(PROBE_SIZES)} sizes: the mean, ring partners, 2(N-1)/N of the "
            f"bucket; {steps} training steps in 3 overlapped buckets equal to one process"
        )

    return run_check("A3.3", "bucket_average", body, max_points=A3_POINTS["A3.3"], verbose=verbose)
