"""The judges of A6.1 and A6.2: a row-parallel linear layer's forward and backward.

Every engine rebuilds ``X``, ``W`` and ``b`` from the case's seed and returns what the
student's layer computed and the counters (:mod:`course_grader.assignments.a6.collect`);
the judge rebuilds them too and computes ``X @ W.T + b`` and its gradients through a full
``nn.Linear``-like product itself. The layer's input width 7 splits 3, 2, 2 over the 3 ranks:
uneven shards. The forward must cost one allreduce of the output and nothing else, the backward
one allgather of this rank's slice of dL/dX (padded to the widest slice); wrong numbers are
compared with the usual mistakes and the reason names the match.
"""

from __future__ import annotations

from typing import Any

from course_grader.assignments.a6.collect import (
    TRAIN_LR,
    TRAIN_STEPS,
    case_seed,
    close,
    mlp_data,
    p2p_of,
    row_data,
    used_of,
)
from course_lib.i18n import N_, _

__all__ = ["ROW_PARALLEL_CASES", "judge_row_parallel", "judge_row_training", "row_parallel_cases"]

ROW_PARALLEL_CASES = ((4, 7, 5), (1, 3, 1), (6, 12, 8))  # (batch, in, out) on 3 ranks


def row_parallel_cases(backward: bool, seed: int | None = None) -> list[dict]:
    """A6.1's cases (the shapes); A6.2 adds a short training of an MLP."""
    cases = [
        {"kind": "row", "batch": b, "d_in": i, "d_out": o, "seed": case_seed(100 * b + i, seed)}
        for b, i, o in ROW_PARALLEL_CASES
    ]
    if backward:
        cases.append(
            {"kind": "row_training", "seed": case_seed(61, seed), "data_seed": case_seed(62, seed)}
        )
    return cases


def _forward_fault(case: str, r: int, p: int, data: tuple, want: Any, partial: Any, b: Any) -> str:
    """Return "" or what is wrong with rank ``r``'s row-parallel forward (A6.1)."""
    Y, used, p2p = data[0], used_of(data[1]), p2p_of(data[2])
    if not close(Y, want):
        if close(Y, partial):
            return _(
                "{case}: Y is this rank's partial sum; sum the partial products over ranks"
            ).format(case=case)
        if close(Y, want + (p - 1) * b):
            return _("{case}: Y holds b {p} times: add the bias once, after the sum").format(
                case=case, p=p
            )
        return _("{case}: Y on rank {r} differs from X @ W.T + b").format(case=case, r=r)
    batch, d_out = want.shape
    if used != {"allreduce": (1, batch * d_out * 4)} or p2p:
        return _(
            "{case}: the forward on rank {r} called {used} and sent "
            "point-to-point {p2p}; it needs one comm.allreduce of the "
            "{batch} x {d_out} partial product ({nbytes} bytes), nothing else"
        ).format(
            case=case,
            r=r,
            used=used or _("no collective"),
            p2p=p2p or _("nothing"),
            batch=batch,
            d_out=d_out,
            nbytes=batch * d_out * 4,
        )
    return ""


def judge_row_parallel(case: dict, r: int, p: int, data: Any, backward: bool) -> str:
    """Return "" or what is wrong with rank ``r``'s forward (and backward) on one shape."""
    from course_lib.comm import chunk_bounds

    batch, d_in, d_out = case["batch"], case["d_in"], case["d_out"]
    X, W, b, G = row_data(batch, d_in, d_out, case["seed"])
    bounds = chunk_bounds(d_in, p)
    lo, hi = bounds[r]
    case = _("X {x}, W {w}, rank {r} holds W[:, {lo}:{hi}]").format(
        x=tuple(X.shape), w=tuple(W.shape), r=r, lo=lo, hi=hi
    )
    assert isinstance(data, tuple) and len(data) == (8 if backward else 3), _(
        "rank {r} returned no result"
    ).format(r=r)
    fault = _forward_fault(case, r, p, data, X @ W.T + b, X[:, lo:hi] @ W[:, lo:hi].T + b, b)
    if fault:  # A6.2 runs the student's A6.1 forward: say where the fault is
        return (
            _(
                "{fault} (the forward is your A6.1 answer: fix A6.1 first, A6.2's check runs it)"
            ).format(fault=fault)
            if backward
            else fault
        )
    if not backward:
        return ""
    Xr, Wr, br = (t.clone().requires_grad_() for t in (X, W, b))
    ((Xr @ Wr.T + br) * G).sum().backward()
    used, p2p = used_of(data[6]), p2p_of(data[7])
    for name, got, ref in (
        ("dL/dX", data[3], Xr.grad),
        ("dL/dW_shard", data[4], Wr.grad[:, lo:hi]),
        ("dL/db", data[5], br.grad),
    ):
        if got is None:
            return _(
                "{case}: backward returned no {name}; return one gradient per input of forward"
            ).format(case=case, name=name)
        if close(got, ref):
            continue
        if close(got, p * ref):
            return _(
                "{case}: {name} is {p} times too large: the forward's sum has the identity "
                "as its backward (dY is already the same on every rank): do not reduce dY"
            ).format(case=case, name=name, p=p)
        if (
            name == "dL/dX"
            and getattr(got, "shape", None) == tuple(ref.shape)
            and close(got[:, lo:hi], ref[:, lo:hi])
        ):
            return _(
                "{case}: dL/dX on rank {r} is right in columns {lo}:{hi} only: every rank "
                "used all of X, so it needs every rank's slice: gather them"
            ).format(case=case, r=r, lo=lo, hi=hi)
        return _("{case}: {name} on rank {r} differs from the one-process gradient").format(
            case=case, name=name, r=r
        )
    widest = max(stop - start for start, stop in bounds)
    want = {"allgather": (1, batch * widest * 4)}
    if used != want or p2p:
        return _(
            "{case}: the backward on rank {r} called {used}, point-to-"
            "point {p2p}; it needs one comm.allgather of this rank's slice of "
            "dL/dX padded to the widest slice ({batch} x {widest}, {nbytes} "
            "bytes): the slices are disjoint, an allreduce of a padded dX moves twice that"
        ).format(
            case=case,
            r=r,
            used=used or _("no collective"),
            p2p=p2p or _("nothing"),
            batch=batch,
            widest=widest,
            nbytes=batch * widest * 4,
        )
    return ""


def judge_row_training(case: dict, r: int, p: int, data: Any) -> str:
    """Return "" or how rank ``r``'s MLP 5-7-3 after 3 SGD steps differs from one process."""
    import torch
    import torch.nn.functional as F

    from course_lib.comm import chunk_bounds

    weights, batches = mlp_data(case["seed"], case["data_seed"])
    lo, hi = chunk_bounds(7, p)[r]
    ref = [t.clone().requires_grad_() for t in weights]
    for X, y in batches:
        F.cross_entropy(torch.tanh(X @ ref[0].T + ref[1]) @ ref[2].T + ref[3], y).backward()
        with torch.no_grad():
            for t in ref:
                t -= TRAIN_LR * t.grad
                t.grad = None
    want = [ref[0], ref[1], ref[2][:, lo:hi], ref[3]]
    names = (N_("W1 (replicated)"), N_("b1 (replicated)"), N_("the shard of W2"), "b2")
    mine = list(data) if isinstance(data, tuple) else []
    for name, got, ref_t in zip(names, mine + [None] * (4 - len(mine)), want, strict=False):
        if not close(got, ref_t.detach()):
            return _(
                "MLP 5-7-3, {steps} SGD steps: {name} on rank {r} differs from one-process training"
            ).format(steps=TRAIN_STEPS, name=_(name), r=r)
    return ""
