"""Checks for the exercises of lecture 4 (data parallelism), run on real engines.

Exercise 4.1 trains with the student's averaging on every engine (through
:func:`~course_lib.parallel.data_parallel.train.train_data_parallel`) and compares every replica with
one process trained on the whole global batch, and each rank's bytes with a parameter server's.
Exercise 4.2 compares the student's prediction of one exchange with the alpha-beta formulas.
While the student's function runs, the library's parameter server and cost model refuse to
(:func:`course_lib.checks.verdict.refusing`): the lecture imports both to teach from them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch.utils.data import TensorDataset

from course_lib.checks.verdict import Verdict, refusing, reraise_stub, run_check
from course_lib.comm.communicator import Communicator
from course_lib.cost_model.alpha_beta import ALGORITHMS
from course_lib.data.digits import load_digits
from course_lib.i18n import N_, _
from course_lib.parallel.data_parallel.reference import (
    max_weight_difference,
    train_one_process,
    weights_match,
)
from course_lib.parallel.exchanges.registry import EXCHANGES
from course_lib.training.loop import TrainConfig
from course_lib.training.models import MLP

__all__ = [
    "EXERCISE_METHOD",
    "REFUSED",
    "check_parameter_server",
    "check_sync_time",
]

EXERCISE_METHOD = "exercise_4_1"
_PS = "course_lib.parallel.exchanges.parameter_server.ParameterServer"
_COST = "course_lib.cost_model.alpha_beta"
_FORMULA = N_("write the alpha-beta sum yourself: messages x (alpha + bytes x beta)")
REFUSED = {  # exercise -> the library functions that answer it, and what to write instead
    "4.1": {
        f"{_PS}.average": N_(
            "send to rank 0 with comm.send, sum and divide there, send the mean back"
        ),
        f"{_PS}.combine_in_place": N_("add the gradients and divide by N yourself"),
    },
    "4.2": {
        f"{_COST}.predict": _FORMULA,
        f"{_COST}.ALGORITHMS[star_allreduce]": _FORMULA,
        f"{_COST}.ALGORITHMS[ring_allreduce]": _FORMULA,
    },
}
CHECK_CONFIG = TrainConfig(num_epochs=2, batch_size=48, lr=0.5, momentum=0.5, seed=5)


def check_net() -> MLP:
    """The check's network: 64 -> 13 -> 10 (985 values, a number no world size divides)."""
    return MLP(64, (13,))


def check_digits() -> TensorDataset:
    """The first 240 training digits: 5 global batches of 48 per epoch."""
    X, y = load_digits().tensors
    return TensorDataset(X[:240], y[:240])


# ---- Exercise 4.1: the parameter server's averaging -------------------------------------------
def _exercise_exchange(fn: Callable) -> Any:
    """Return an exchange method (named ``EXERCISE_METHOD``) that averages with ``fn(comm, flat)``.

    The instance travels to the engines by value, with ``fn``: no registration anywhere.
    """
    from course_lib.parallel.exchanges.base import FlatExchange

    class ExerciseExchange(FlatExchange):
        name = EXERCISE_METHOD

        def average(self, comm: Communicator, flat: np.ndarray) -> None:
            from course_lib.checks.lecture04 import REFUSED
            from course_lib.checks.verdict import refusing

            with refusing(REFUSED["4.1"], fn):
                out = fn(comm, flat)
            if out is not None and out is not flat:  # an answer may return a new array
                np.copyto(flat, np.asarray(out, dtype=flat.dtype).reshape(flat.shape))

    return ExerciseExchange()


def _expected_bytes(rank: int, n: int, nbytes: int) -> tuple[int, int]:
    """(sent, received) point-to-point per step: a worker S each way, the server (N-1) S."""
    return ((n - 1) * nbytes,) * 2 if rank == 0 else (nbytes, nbytes)


def _parameter_server_body(fn: Callable, cluster: Any, world_size: int | None) -> str:
    from course_lib.parallel.data_parallel.train import DataParallelError, train_data_parallel

    try:
        result = train_data_parallel(
            cluster,
            model=check_net,
            dataset=check_digits,
            config=CHECK_CONFIG,
            method=_exercise_exchange(fn),
            world_size=world_size,
            comm_timeout=20,
            timeout=240,
        )
    except DataParallelError as exc:
        reraise_stub(exc)  # a LibraryCall on the engines: the same refusal here
        if "NotImplementedError" in str(exc):
            raise NotImplementedError(
                "Exercise 4.1: write the parameter server's averaging"
            ) from None
        raise AssertionError(str(exc).replace("data-parallel run failed: ", "")) from None
    n = result.world_size
    if n < 2:
        raise AssertionError(_("the check needs at least 2 engines (start_cluster(n=4))"))
    if not result.replicas_equal:
        raise AssertionError(
            _(
                "the replicas differ by up to {diff} after training: "
                "every rank must end with the same averaged gradient"
            ).format(diff=f"{result.max_replica_difference:.2e}")
        )
    reference = train_one_process(check_net, check_digits, CHECK_CONFIG)
    worst = max_weight_difference(result.weights, reference)
    if not weights_match(result.weights, reference):
        raise AssertionError(
            _(
                "the replicas agree with each other but differ from one process trained on the "
                "whole batch by up to {worst}: divide the sum of all {n} gradients (the "
                "server's own included) by N once, after adding them"
            ).format(worst=f"{worst:.2e}", n=n)
        )
    for rec in result.records:
        if rec["collective_bytes"]:
            raise AssertionError(
                _(
                    "rank {rank} used a built-in collective ({nbytes} bytes):"
                    " write the exchange with comm.send / comm.recv (isend / irecv)"
                ).format(rank=rec["rank"], nbytes=rec["collective_bytes"])
            )
        buffer = result.gradient_bytes + result.flag_bytes  # the values and their presence flags
        want = _expected_bytes(rec["rank"], n, buffer)
        got = (rec["bytes_sent"], rec["bytes_received"])
        if got != want:
            raise AssertionError(
                (
                    _(
                        "rank {rank} sent / received {got} bytes in step {step}; a parameter "
                        "server's server moves {want} (gradient of {grad} bytes and {flags} of flags)"
                    )
                    if rec["rank"] == 0
                    else _(
                        "rank {rank} sent / received {got} bytes in step {step}; a parameter "
                        "server's worker moves {want} (gradient of {grad} bytes and {flags} of flags)"
                    )
                ).format(
                    rank=rec["rank"],
                    got=got,
                    step=rec["step"],
                    want=want,
                    grad=result.gradient_bytes,
                    flags=result.flag_bytes,
                )
            )
    steps = len(result.records) // n
    return _(
        "{n} engines, {steps} steps equal to one process within {worst}, server bytes (N-1)S"
    ).format(n=n, steps=steps, worst=f"{worst:.1e}")


def check_parameter_server(
    fn: Callable, cluster: Any, *, world_size: int | None = None, verbose: bool = True
) -> Verdict:
    """Exercise 4.1: train with ``fn(comm, flat)`` as the averaging on the engines; compare.

    Passes when every replica equals one process trained on the whole global batch (within
    float32 rounding) and each rank moved exactly a parameter server's bytes point-to-point.
    """
    body = lambda: _parameter_server_body(fn, cluster, world_size)  # noqa: E731
    return run_check("4.1", "parameter server", body, verbose=verbose)


# ---- Exercise 4.2: predict one exchange ---------------------------------------------------------
def _model_sync_time(
    method: str, nbytes: float, world_size: int, alpha: float, beta: float
) -> float:
    """The cost model's time of one exchange: the star (server) or the ring."""
    return ALGORITHMS[EXCHANGES[method].cost_collective](nbytes, world_size, alpha, beta)


def _sync_time_body(fn: Callable) -> str:
    cases = [
        (m, n, p, a, b)
        for m in ("parameter_server", "ring")
        for n in (4e3, 8.33e6)
        for p in (2, 3, 6)
        for a, b in ((50e-6, 1 / 125e6), (1e-3, 1 / 12.5e6))
    ]
    for method, nbytes, p, alpha, beta in cases:
        with refusing(REFUSED["4.2"], fn):
            got = float(fn(method, nbytes, p, alpha, beta))
        want = _model_sync_time(method, nbytes, p, alpha, beta)
        if not np.isclose(got, want, rtol=1e-6, atol=1e-12):
            raise AssertionError(
                _(
                    "{method}, {nbytes} bytes, N={p}, alpha={alpha} s, 1/beta={rate} B/s:"
                    " got {got} s, the alpha-beta model gives {want} s"
                ).format(
                    method=method,
                    nbytes=f"{nbytes:g}",
                    p=p,
                    alpha=f"{alpha:g}",
                    rate=f"{1 / beta:g}",
                    got=f"{got:.4g}",
                    want=f"{want:.4g}",
                )
            )
    return _("{count} cases: server 2(N-1)(a+nb), ring 2(N-1)(a+nb/N)").format(count=len(cases))


def check_sync_time(fn: Callable, *, verbose: bool = True) -> Verdict:
    """Exercise 4.2: ``fn(method, nbytes, world_size, alpha, beta)`` against the cost model."""
    return run_check("4.2", "predicted exchange time", lambda: _sync_time_body(fn), verbose=verbose)
