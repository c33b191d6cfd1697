"""Lecture 4: Calibrate the cost model on the engines of a data-parallel run, the way its exchange sees them.

Shipped to the engines by reference, like :mod:`course_lib.parallel.data_parallel.replica`; the communicator is
the one a run set up (found in the engine's namespace by name). Two kinds of fit of the same
link: ping-pong between ranks 0 and 1 (one pair, the others idle), and each exchange's own
collective timed over every rank and fitted to its own formula
(:func:`course_lib.cost_model.alpha_beta.collective_calibration`), plus that collective's times at sizes
outside the fit, so a benchmark can show each model's error where it did not fit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["FIT_SIZES", "PING_SIZES", "engine_calibrations"]

PING_SIZES = [2**k for k in range(10, 23, 3)]  # 1 KB .. 4 MB
FIT_SIZES = [2**18, 2**20, 2**22, 2**23]  # 256 KB .. 8 MB


def engine_calibrations(
    comm_name: str,
    algorithms: list[str] = ("ring_allreduce",),
    check_sizes: list[int] = (),
    fit_sizes: list[int] | None = None,
    reps: int = 3,
) -> dict[str, Any]:
    """Return the ping-pong fit, each algorithm's own fit and its times at ``check_sizes``.

    Fits are ``(alpha, beta)``; every rank calls it and all return the same numbers (rank 0's
    medians of the slowest rank's times).
    """
    from IPython import get_ipython

    from course_lib import collectives
    from course_lib.cost_model.alpha_beta import allreduce_times, collective_calibration, ping_pong

    comm = get_ipython().user_ns[comm_name]
    pp = ping_pong(comm, sizes=PING_SIZES, repeats=reps).model
    fits, checks = {}, {}
    for algorithm in algorithms:
        cal = collective_calibration(comm, algorithm, sizes=fit_sizes or FIT_SIZES, reps=reps)
        fits[algorithm] = (cal.model.alpha, cal.model.beta)
        fn = getattr(collectives, algorithm)
        times = np.array(
            [
                np.median(allreduce_times(comm, fn, np.ones(s // 4, np.float32), reps, 1))
                for s in check_sizes
            ]
        )
        if times.size:
            comm.broadcast(times, src=0)
        checks[algorithm] = dict(zip(list(check_sizes), times.tolist(), strict=True))
    return {"ping_pong": (pp.alpha, pp.beta), "fits": fits, "checks": checks}
