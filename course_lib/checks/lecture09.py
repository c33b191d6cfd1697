"""Checks for the exercises of lecture 9 (model parallelism), run on real engines.

Each check calls the student's function on every engine with that engine's communicator and
compares the result with one full matrix product (9.1, 9.2) or with the sum over ranks of every
rank's share of a gradient (9.3, Krizhevsky's hybrid); it also reads the communicator's
counters, so an answer that moves more than the split needs (gathering all of W, say, or an
allreduce where a reduce-scatter suffices) does not pass. While the student's function runs, the
library's operators that answer the exercise refuse to (:func:`course_lib.checks.verdict.refusing`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from course_lib.checks.verdict import Verdict, raise_as_in_the_notebook, refusing, run_check
from course_lib.i18n import N_, _

__all__ = [
    "REFUSED",
    "check_column_parallel",
    "check_features_grad",
    "check_features_grad_on_rank",
    "check_on_rank",
    "check_row_parallel",
    "stub_column_parallel",
    "stub_features_grad",
    "stub_row_parallel",
]


_TP = "course_lib.parallel.model_parallel.tensor_parallel"
REFUSED = {  # exercise -> the library functions that answer it, and what to write instead
    "9.1": {
        f"{_TP}.gather_from_parallel": N_(
            "multiply X @ W_shard.T, then comm.allgather the pieces and put them side by side"
        )
    },
    "9.2": {f"{_TP}.reduce_from_parallel": N_("sum the partial product with comm.allreduce")},
    "9.3": {
        "course_lib.parallel.model_parallel.hybrid.scatter_batch_grad": N_(
            "use comm.reduce_scatter and reshape its chunk to this rank's rows"
        )
    },
}


def stub_column_parallel(comm: Any, X: Any, W_shard: Any) -> Any:
    """The released stub of Exercise 9.1."""
    raise NotImplementedError(
        "Exercise 9.1: compute X @ W_shard.T, then gather every rank's columns"
    )


def stub_row_parallel(comm: Any, X_shard: Any, W_shard: Any) -> Any:
    """The released stub of Exercise 9.2."""
    raise NotImplementedError("Exercise 9.2: compute the partial product, then sum it over ranks")


def stub_features_grad(comm: Any, grad_whole: Any) -> Any:
    """The released stub of Exercise 9.3."""
    raise NotImplementedError(
        "Exercise 9.3: sum every rank's grad_whole and keep the rows of this rank's samples"
    )


def check_features_grad_on_rank(comm: Any, fn: Callable) -> str:
    """Run ``fn(comm, grad_whole)`` on this rank for several shapes; raise AssertionError when wrong."""
    import torch

    p, r = comm.world_size, comm.rank
    for rows, width in ((p, 1), (4 * p, 6), (8 * p, 64)):
        shares = torch.randn(p, rows, width, generator=torch.Generator().manual_seed(rows))
        b = rows // p  # every rank's share is known to every rank: the answer is their sum
        want = shares.sum(0)[r * b : (r + 1) * b]
        comm.stats.reset()
        with refusing(REFUSED["9.3"], fn):
            got = fn(comm, shares[r].clone())
        where = _("rank {r}, grad_whole {shape}").format(r=r, shape=(rows, width))
        error = None
        got = torch.as_tensor(got)
        if tuple(got.shape) != tuple(want.shape):
            error = _("{where}: result has shape {got}, expected {want}").format(
                where=where, got=tuple(got.shape), want=(b, width)
            )
        elif not torch.allclose(got.float(), want, atol=1e-5, rtol=1e-5):
            error = _(
                "{where}: result differs from the sum over ranks of their rows "
                "{first}..{last} by up to {diff}"
            ).format(
                where=where,
                first=r * b,
                last=(r + 1) * b - 1,
                diff=f"{(got - want).abs().max():.3g}",
            )
        else:
            others = sorted(set(comm.stats.collectives) - {"reduce_scatter"})
            sent, limit = comm.stats.bytes_sent, (p - 1) * b * width * 4  # a ring reduce-scatter
            if others or sent > limit:
                used = (
                    ", ".join(others)
                    if others
                    else _("{sent} bytes sent (ring: {limit})").format(sent=sent, limit=limit)
                )
                error = _(
                    "{where}: moves more than the answer needs ({used}): each rank needs only "
                    "its own rows of the sum, which one reduce-scatter gives "
                    "(comm.reduce_scatter); an allreduce or allgather sends the whole batch"
                ).format(where=where, used=used)
        failed = comm.allreduce(np.array([1 if error else 0], dtype=np.int64), op="max")
        if failed[0]:  # every rank stops at the same case, or the others would wait
            raise AssertionError(
                error or _("{shape}: another rank's result was wrong").format(shape=(rows, width))
            )
    return _("{p} ranks, 3 shapes, one reduce-scatter").format(p=p)


def check_on_rank(comm: Any, fn: Callable, exercise: str) -> str:
    """Run ``fn`` on this rank for several shapes; raise AssertionError when wrong (every rank calls it)."""
    import torch

    p, r = comm.world_size, comm.rank
    for batch, d_in, d_out in ((1, p, p), (5, 3 * p, 2 * p), (16, 8 * p, 4 * p)):
        gen = torch.Generator().manual_seed(batch)  # the same X and W on every rank
        X, W = torch.randn(batch, d_in, generator=gen), torch.randn(d_out, d_in, generator=gen)
        want = X @ W.T
        comm.stats.reset()
        with refusing(REFUSED[exercise], fn):
            if exercise == "9.1":
                k = d_out // p  # output neurons per rank
                got, allowed = fn(comm, X, W[r * k : (r + 1) * k]), batch * k * 4
            else:
                k = d_in // p  # input features per rank
                got = fn(comm, X[:, r * k : (r + 1) * k], W[:, r * k : (r + 1) * k])
                allowed = batch * d_out * 4
        where = _("rank {r}, X {x}, W {w}").format(r=r, x=tuple(X.shape), w=tuple(W.shape))
        error = _problem(comm, got, want, allowed, where)
        failed = comm.allreduce(np.array([1 if error else 0], dtype=np.int64), op="max")
        if failed[0]:  # every rank stops at the same case, or the others would wait
            raise AssertionError(
                error or _("X {x}: another rank's result was wrong").format(x=tuple(X.shape))
            )
    what = _("gathered output columns") if exercise == "9.1" else _("one allreduce of partial sums")
    return _("{p} ranks, 3 shapes, {what}").format(p=p, what=what)


def _problem(comm: Any, got: Any, want: Any, allowed: int, where: str) -> str | None:
    import torch

    got = torch.as_tensor(got)
    if tuple(got.shape) != tuple(want.shape):
        return _("{where}: result has shape {got}, expected {want}").format(
            where=where, got=tuple(got.shape), want=tuple(want.shape)
        )
    if not torch.allclose(got.float(), want, atol=1e-4, rtol=1e-5):
        return _("{where}: result differs from X @ W.T by up to {diff}").format(
            where=where, diff=f"{(got - want).abs().max():.3g}"
        )
    sent = comm.stats.bytes_sent + sum(c.bytes for c in comm.stats.collectives.values())
    if sent > allowed:
        return _(
            "{where}: handed {sent} bytes to the network, the split needs only {allowed} "
            "(send this rank's own result, not the inputs or the weights)"
        ).format(where=where, sent=sent, allowed=allowed)
    return None


def _engine_check(name: str, fn: Callable, exercise: str) -> str:
    from IPython import get_ipython

    from course_lib.checks.lecture09 import check_features_grad_on_rank, check_on_rank

    comm = get_ipython().user_ns[name]
    if exercise == "9.3":
        return check_features_grad_on_rank(comm, fn)
    return check_on_rank(comm, fn, exercise)


def _check(
    exercise: str,
    title: str,
    fn: Callable,
    cluster: Any,
    comm_name: str,
    verbose: bool,
    timeout: float,
) -> Verdict:
    def body() -> str:
        try:
            return cluster.run(_engine_check, comm_name, fn, exercise, timeout=timeout)[0]
        except Exception as exc:  # noqa: BLE001 - ipyparallel wraps the engine's exception
            raise_as_in_the_notebook(
                exc, _("Exercise {exercise}: write {title}").format(exercise=exercise, title=title)
            )

    return run_check(exercise, title, body, verbose=verbose)


def _public_check(exercise: str, title: str, name: str, doc: str) -> Callable[..., Verdict]:
    """Return the notebook's check ``name`` of ``exercise``: the answer runs on every engine."""

    def check(
        fn: Callable,
        cluster: Any,
        *,
        comm_name: str = "comm",
        verbose: bool = True,
        timeout: float = 90.0,
    ) -> Verdict:
        return _check(exercise, title, fn, cluster, comm_name, verbose, timeout)

    check.__name__ = check.__qualname__ = name
    check.__doc__ = doc
    return check


check_column_parallel = _public_check(
    "9.1",
    "column-parallel matmul",
    "check_column_parallel",
    "Exercise 9.1: ``fn(comm, X, W_shard)`` returns the full ``X @ W.T`` on every rank.",
)
check_row_parallel = _public_check(
    "9.2",
    "row-parallel matmul",
    "check_row_parallel",
    "Exercise 9.2: ``fn(comm, X_shard, W_shard)`` returns the full ``X @ W.T`` on every rank.",
)
check_features_grad = _public_check(
    "9.3",
    "the features' gradient",
    "check_features_grad",
    "Exercise 9.3: ``fn(comm, grad_whole)`` returns the summed gradient of this rank's samples.",
)
