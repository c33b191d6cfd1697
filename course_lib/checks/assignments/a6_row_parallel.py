"""The engine side of A6.1 and A6.2: a row-parallel linear layer's forward and backward.

Every engine rebuilds ``X``, ``W`` and ``b`` from a fixed seed and computes ``X @ W.T + b`` and
its gradients through a full ``nn.Linear``-like product itself. The layer's input width 7 splits
3, 2, 2 over the 3 ranks: uneven shards. The forward must cost one allreduce of the output and
nothing else, the backward one allgather of this rank's slice of dL/dX (padded to the widest
slice); wrong numbers are compared with the usual mistakes and the reason names the match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.checks.assignments.a6_counters import (
    TRAIN_LR,
    TRAIN_STEPS,
    builtins_used,
    close,
    p2p_traffic,
)

__all__ = ["ROW_PARALLEL_CASES", "row_parallel_case", "row_parallel_training"]

ROW_PARALLEL_CASES = ((4, 7, 5), (1, 3, 1), (6, 12, 8))  # (batch, in, out) on 3 ranks


def _no_backward(ctx: Any, *grads: Any) -> Any:
    raise RuntimeError("A6.1 checks the forward only")


def _function(forward: Callable, backward: Callable | None) -> Any:
    """Return the autograd.Function made of the student's ``forward`` and ``backward``."""
    import torch

    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward or _no_backward)}
    return type("RowParallelLinearFn", (torch.autograd.Function,), methods)


def row_parallel_case(
    comm: Any, forward: Callable, backward: Callable | None, batch: int, d_in: int, d_out: int
) -> str:
    """Run ``forward`` (and ``backward``) on one shape; return "" or what is wrong."""
    import torch

    from course_lib.comm import chunk_bounds

    p, r = comm.world_size, comm.rank
    gen = torch.Generator().manual_seed(100 * batch + d_in)
    X, W, b = (torch.randn(*s, generator=gen) for s in ((batch, d_in), (d_out, d_in), (d_out,)))
    G = torch.randn(batch, d_out, generator=gen)  # dL/dY of the loss L = sum(Y * G)
    bounds = chunk_bounds(d_in, p)
    lo, hi = bounds[r]
    case = f"X {tuple(X.shape)}, W {tuple(W.shape)}, rank {r} holds W[:, {lo}:{hi}]"
    fn = _function(forward, backward)
    x, w, bias = (t.clone().requires_grad_() for t in (X, W[:, lo:hi], b))
    comm.stats.reset()
    out = fn.apply(x, w, bias, comm, bounds)
    used, p2p = builtins_used(comm), p2p_traffic(comm)
    Y = out.detach() if isinstance(out, torch.Tensor) else out
    if not close(Y, X @ W.T + b):
        if close(Y, X[:, lo:hi] @ W[:, lo:hi].T + b):
            return f"{case}: Y is this rank's partial sum; sum the partial products over ranks"
        if close(Y, X @ W.T + p * b):
            return f"{case}: Y holds b {p} times: add the bias once, after the sum"
        return f"{case}: Y on rank {r} differs from X @ W.T + b"
    want = {"allreduce": (1, batch * d_out * 4)}
    if used != want or p2p:
        return (
            f"{case}: the forward on rank {r} called {used or 'no collective'} and sent "
            f"point-to-point {p2p or 'nothing'}; it needs one comm.allreduce of the "
            f"{batch} x {d_out} partial product ({batch * d_out * 4} bytes), nothing else"
        )
    if backward is None:
        return ""
    Xr, Wr, br = (t.clone().requires_grad_() for t in (X, W, b))
    ((Xr @ Wr.T + br) * G).sum().backward()
    comm.stats.reset()
    (out * G).sum().backward()
    used, p2p = builtins_used(comm), p2p_traffic(comm)
    for name, got, ref in (
        ("dL/dX", x.grad, Xr.grad),
        ("dL/dW_shard", w.grad, Wr.grad[:, lo:hi]),
        ("dL/db", bias.grad, br.grad),
    ):
        if got is None:
            return f"{case}: backward returned no {name}; return one gradient per input of forward"
        if close(got, ref):
            continue
        if close(got, p * ref):
            return (
                f"{case}: {name} is {p} times too large: the forward's sum has the identity "
                "as its backward (dY is already the same on every rank): do not reduce dY"
            )
        if name == "dL/dX" and got.shape == ref.shape and close(got[:, lo:hi], ref[:, lo:hi]):
            return (
                f"{case}: dL/dX on rank {r} is right in columns {lo}:{hi} only: every rank "
                "used all of X, so it needs every rank's slice: gather them"
            )
        return f"{case}: {name} on rank {r} differs from the one-process gradient"
    widest = max(stop - start for start, stop in bounds)
    want = {"allgather": (1, batch * widest * 4)}
    if used != want or p2p:
        return (
            f"{case}: the backward on rank {r} called {used or 'no collective'}, point-to-"
            f"point {p2p or 'nothing'}; it needs one comm.allgather of this rank's slice of "
            f"dL/dX padded to the widest slice ({batch} x {widest}, {batch * widest * 4} "
            "bytes): the slices are disjoint, an allreduce of a padded dX moves twice that"
        )
    return ""


def row_parallel_training(comm: Any, forward: Callable, backward: Callable) -> str:
    """Train Linear(5, 7) -> tanh -> row-parallel Linear(7, 3) 3 steps; compare with one process."""
    import torch
    import torch.nn.functional as F

    from course_lib.comm import chunk_bounds

    torch.manual_seed(61)
    W1, b1, W2, b2 = torch.randn(7, 5), torch.randn(7), torch.randn(3, 7), torch.randn(3)
    bounds = chunk_bounds(7, comm.world_size)
    lo, hi = bounds[comm.rank]
    fn = _function(forward, backward)
    mine = [t.clone().requires_grad_() for t in (W1, b1, W2[:, lo:hi], b2)]
    ref = [t.clone().requires_grad_() for t in (W1, b1, W2, b2)]
    gen = torch.Generator().manual_seed(62)
    for _ in range(TRAIN_STEPS):
        X, y = torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        h = torch.tanh(X @ mine[0].T + mine[1])
        F.cross_entropy(fn.apply(h, mine[2], mine[3], comm, bounds), y).backward()
        F.cross_entropy(torch.tanh(X @ ref[0].T + ref[1]) @ ref[2].T + ref[3], y).backward()
        with torch.no_grad():
            for t in mine + ref:
                t -= TRAIN_LR * t.grad
                t.grad = None
    want = [ref[0], ref[1], ref[2][:, lo:hi], ref[3]]
    names = ("W1 (replicated)", "b1 (replicated)", "the shard of W2", "b2")
    for name, got, ref_t in zip(names, mine, want, strict=True):
        if not close(got.detach(), ref_t.detach()):
            return (
                f"MLP 5-7-3, {TRAIN_STEPS} SGD steps: {name} on rank {comm.rank} differs "
                "from one-process training"
            )
    return ""
