"""Checks of assignment A6 (a row-parallel linear layer's autograd; a GPipe step), on engines.

The student's functions travel to every engine by value (cloudpickle) and run there with the
engine's communicator. Every engine rebuilds the same inputs and weights from a fixed seed and
computes the one-process reference itself: ``X @ W.T + b`` and its gradients through a full
``nn.Linear``-like product (A6.1, A6.2), the whole model's full-batch gradients and SGD steps
(A6.3, A6.4). The layer's input width 7 splits 3, 2, 2 over the 3 ranks: uneven shards.

Right numbers are not enough. The counters of each communicator tell who talked to whom: the
row-parallel forward must cost one allreduce of the output and nothing else, its backward one
allgather of this rank's slice of dL/dX (padded to the widest slice); a GPipe stage sends m
activations to the next stage and m gradients to the previous one, each of a micro-batch's
size, and calls no collective. The stage the check hands to the step records the order of its
forward and backward passes, so a naive schedule (F B F B) fails A6.3 although its gradients
are right. Wrong numbers are compared with the usual mistakes and the verdict names the match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.verdict import Verdict, reraise_stub, run_check

__all__ = [
    "A6_POINTS",
    "PIPELINE_WIDTHS",
    "ROW_PARALLEL_CASES",
    "check_gpipe_step",
    "check_gpipe_training",
    "check_row_parallel_backward",
    "check_row_parallel_forward",
    "pipeline_model",
]

A6_POINTS = {"A6.1": 2.0, "A6.2": 3.0, "A6.3": 3.0, "A6.4": 2.0}
ROW_PARALLEL_CASES = ((4, 7, 5), (1, 3, 1), (6, 12, 8))  # (batch, in, out) on 3 ranks
PIPELINE_WIDTHS = (6, 10, 7, 4)  # stage s receives micro-batches of PIPELINE_WIDTHS[s] features
PIPELINE_CASES = ((12, 4), (9, 3))  # (batch, micro-batches)
TRAIN_STEPS, TRAIN_LR = 3, 0.1
TOL = {"rtol": 1e-4, "atol": 1e-5}


def pipeline_model(seed: int = 6) -> Any:
    """Return the 7-layer MLP the pipeline checks cut into 3 stages (layers 0:2, 2:4, 4:7)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    a, b, c, d = PIPELINE_WIDTHS
    return nn.Sequential(nn.Linear(a, b), nn.Tanh(), nn.Linear(b, c), nn.ReLU(),
                         nn.Linear(c, 9), nn.Tanh(), nn.Linear(9, d))  # fmt: skip


STAGES = ((0, 2), (2, 4), (4, 7))


# -- on the engines: shared helpers ------------------------------------------------------------


def _builtins_used(comm: Any) -> dict[str, tuple[int, int]]:
    return {n: (c.calls, c.bytes) for n, c in comm.stats.collectives.items() if n != "barrier"}


def _p2p(comm: Any) -> dict[int, tuple[int, int, int, int]]:
    """Return {peer: (messages sent, bytes sent, messages received, bytes received)}."""
    return {p: (s.messages_sent, s.bytes_sent, s.messages_received, s.bytes_received)
            for p, s in sorted(comm.stats.peers.items())
            if s.messages_sent or s.messages_received}  # fmt: skip


def _agree(comm: Any, why: str) -> str:
    """Return ``why``, or a note that another rank failed: every rank stops at the same case."""
    import numpy as np

    failed = comm.allreduce(np.array([1 if why else 0], dtype=np.int64), op="max")
    return why or ("another rank found a problem in this case" if failed[0] else "")


def _close(got: Any, want: Any) -> bool:
    import torch

    return got is not None and got.shape == want.shape and torch.allclose(got, want, **TOL)


# -- A6.1 and A6.2: the row-parallel layer -------------------------------------------------------


def _no_backward(ctx: Any, *grads: Any) -> Any:
    raise RuntimeError("A6.1 checks the forward only")


def _function(forward: Callable, backward: Callable | None) -> Any:
    """Return the autograd.Function made of the student's ``forward`` and ``backward``."""
    import torch

    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward or _no_backward)}
    return type("RowParallelLinearFn", (torch.autograd.Function,), methods)


def _row_parallel_case(comm: Any, forward: Callable, backward: Callable | None,
                       batch: int, d_in: int, d_out: int) -> str:  # fmt: skip
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
    used, p2p = _builtins_used(comm), _p2p(comm)
    Y = out.detach() if isinstance(out, torch.Tensor) else out
    if not _close(Y, X @ W.T + b):
        if _close(Y, X[:, lo:hi] @ W[:, lo:hi].T + b):
            return f"{case}: Y is this rank's partial sum; sum the partial products over ranks"
        if _close(Y, X @ W.T + p * b):
            return f"{case}: Y holds b {p} times: add the bias once, after the sum"
        return f"{case}: Y on rank {r} differs from X @ W.T + b"
    want = {"allreduce": (1, batch * d_out * 4)}
    if used != want or p2p:
        return (f"{case}: the forward on rank {r} called {used or 'no collective'} and sent "
                f"point-to-point {p2p or 'nothing'}; it needs one comm.allreduce of the "
                f"{batch} x {d_out} partial product ({batch * d_out * 4} bytes), nothing else")  # fmt: skip
    if backward is None:
        return ""
    Xr, Wr, br = (t.clone().requires_grad_() for t in (X, W, b))
    ((Xr @ Wr.T + br) * G).sum().backward()
    comm.stats.reset()
    (out * G).sum().backward()
    used, p2p = _builtins_used(comm), _p2p(comm)
    for name, got, ref in (("dL/dX", x.grad, Xr.grad), ("dL/dW_shard", w.grad, Wr.grad[:, lo:hi]),
                           ("dL/db", bias.grad, br.grad)):  # fmt: skip
        if got is None:
            return f"{case}: backward returned no {name}; return one gradient per input of forward"
        if _close(got, ref):
            continue
        if _close(got, p * ref):
            return (f"{case}: {name} is {p} times too large: the forward's sum has the identity "
                    "as its backward (dY is already the same on every rank): do not reduce dY")  # fmt: skip
        if name == "dL/dX" and got.shape == ref.shape and _close(got[:, lo:hi], ref[:, lo:hi]):
            return (f"{case}: dL/dX on rank {r} is right in columns {lo}:{hi} only: every rank "
                    "used all of X, so it needs every rank's slice: gather them")  # fmt: skip
        return f"{case}: {name} on rank {r} differs from the one-process gradient"
    widest = max(stop - start for start, stop in bounds)
    want = {"allgather": (1, batch * widest * 4)}
    if used != want or p2p:
        return (f"{case}: the backward on rank {r} called {used or 'no collective'}, point-to-"
                f"point {p2p or 'nothing'}; it needs one comm.allgather of this rank's slice of "
                f"dL/dX padded to the widest slice ({batch} x {widest}, {batch * widest * 4} "
                "bytes): the slices are disjoint, an allreduce of a padded dX moves twice that")  # fmt: skip
    return ""


def _row_parallel_training(comm: Any, forward: Callable, backward: Callable) -> str:
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
        if not _close(got.detach(), ref_t.detach()):
            return (f"MLP 5-7-3, {TRAIN_STEPS} SGD steps: {name} on rank {comm.rank} differs "
                    "from one-process training")  # fmt: skip
    return ""


# -- A6.3 and A6.4: GPipe -------------------------------------------------------------------------


def _stage(model: Any, rank: int, log: list[str]) -> Any:
    """Return this rank's layers as a module that logs "F" per forward and "B" per backward."""
    from torch import nn

    class RecordedStage(nn.Sequential):
        def forward(self, x):
            log.append("F")
            out = super().forward(x)
            if out.requires_grad:
                out.register_hook(lambda grad: log.append("B"))
            return out

    lo, hi = STAGES[rank]
    return RecordedStage(*model[lo:hi])


def _pipeline_case(comm: Any, step: Callable, batch: int, m: int, seed: int) -> str:
    """Run one ``step`` on this rank's stage; return "" or what is wrong."""
    import torch
    import torch.nn.functional as F

    s, p = comm.rank, comm.world_size
    log: list[str] = []
    stage, model = _stage(pipeline_model(seed), s, log), pipeline_model(seed)  # model: reference
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(batch, PIPELINE_WIDTHS[0], generator=gen)
    y = torch.randint(0, PIPELINE_WIDTHS[-1], (batch,), generator=gen)
    shapes = [(batch // m, w) for w in PIPELINE_WIDTHS[:p]]
    case = f"batch {batch}, m = {m}, stage {s}"
    comm.stats.reset()
    loss = step(comm, stage, X if s == 0 else None, y if s == p - 1 else None, m, shapes)
    used, p2p = _builtins_used(comm), _p2p(comm)
    ref_loss = F.cross_entropy(model(X), y)
    ref_loss.backward()
    lo, hi = STAGES[s]
    ref = [q.grad.clone() for q in model[lo:hi].parameters()]
    got = [q.grad for q in stage.parameters()]
    if any(g is None for g in got):
        return f"{case}: a parameter of the stage has no gradient: run the backward passes"
    if not all(_close(g, r) for g, r in zip(got, ref, strict=True)):
        if all(_close(g, m * r) for g, r in zip(got, ref, strict=True)):
            return (f"{case}: the gradients are m = {m} times too large: the batch loss is the "
                    "mean of the micro-batch means, divide each micro-batch's loss by m")  # fmt: skip
        model.zero_grad()
        F.cross_entropy(model(X[-(batch // m) :]), y[-(batch // m) :]).backward()
        last = [q.grad for q in model[lo:hi].parameters()]
        if all(_close(g, r) or _close(g, r / m) for g, r in zip(got, last, strict=True)):
            return (f"{case}: only the last micro-batch's gradient is left: accumulate into "
                    ".grad over the m micro-batches (never zero it inside the step)")  # fmt: skip
        return f"{case}: the gradients differ from one full-batch backward in one process"
    if s == p - 1 and (loss is None or abs(float(loss) - ref_loss.item()) > 1e-5):
        return f"{case}: returned loss {loss}, the batch's mean loss is {ref_loss.item():.6f}"
    want = {}
    if s < p - 1:  # activations out, their gradients back, m of each, a micro-batch each
        n = m * (batch // m) * PIPELINE_WIDTHS[s + 1] * 4
        want[s + 1] = (m, n, m, n)
    if s > 0:
        n = m * (batch // m) * PIPELINE_WIDTHS[s] * 4
        want[s - 1] = (m, n, m, n)
    if used or p2p != want:
        show = lambda d: {q: f"{a} messages / {b} bytes out, {c} / {e} in"  # noqa: E731
                          for q, (a, b, c, e) in d.items()}  # fmt: skip
        return (f"{case}: rank {s} talked to {show(p2p) or 'nobody'}"
                f"{f' and called {sorted(used)}' if used else ''}; a stage exchanges only with "
                f"its neighbours, one micro-batch a message, no collective: {show(want)}")  # fmt: skip
    if log != ["F"] * m + ["B"] * m:
        return (f"{case}: the stage ran {' '.join(log)}; GPipe runs all m forwards, then the "
                "m backwards")  # fmt: skip
    return ""


def _reference_training(batches: list, zero_grad: bool) -> Any:
    """Return the model trained on ``batches`` in one process (SGD, momentum 0.9)."""
    import torch
    import torch.nn.functional as F

    model = pipeline_model(7)
    opt = torch.optim.SGD(model.parameters(), lr=TRAIN_LR, momentum=0.9)
    for X, y in batches:
        if zero_grad:
            opt.zero_grad()
        F.cross_entropy(model(X), y).backward()
        opt.step()
    return model


def _pipeline_training(comm: Any, train: Callable) -> str:
    """Run ``train`` for TRAIN_STEPS batches of 16 (m = 4) on this stage; compare the weights."""
    import torch

    s, p = comm.rank, comm.world_size
    stage = _stage(pipeline_model(7), s, [])
    gen = torch.Generator().manual_seed(64)
    batches = [(torch.randn(16, PIPELINE_WIDTHS[0], generator=gen),
                torch.randint(0, PIPELINE_WIDTHS[-1], (16,), generator=gen))
               for _ in range(TRAIN_STEPS)]  # fmt: skip
    mine = [(X if s == 0 else None, y if s == p - 1 else None) for X, y in batches]
    comm.stats.reset()
    train(comm, stage, mine, TRAIN_LR, 4, [(4, w) for w in PIPELINE_WIDTHS[:p]])
    if _builtins_used(comm) or sum(m for m, *_ in _p2p(comm).values()) != TRAIN_STEPS * 4 * (
        1 if s in (0, p - 1) else 2
    ):
        return f"stage {s}: {TRAIN_STEPS} steps need {TRAIN_STEPS} calls of your gpipe_step"
    lo, hi = STAGES[s]
    weights = [q.detach() for q in stage.parameters()]
    for zero_grad in (True, False):
        want = _reference_training(batches, zero_grad)[lo:hi].parameters()
        if all(_close(g, w.detach()) for g, w in zip(weights, want, strict=True)):
            kept = "the gradients of earlier steps were kept: gpipe_step accumulates into .grad"
            return "" if zero_grad else f"{kept}, so zero them before each step (zero_grad())"
    return (f"after {TRAIN_STEPS} steps the weights of stage {s} differ from the same model "
            "trained in one process (SGD, momentum 0.9, lr)")  # fmt: skip


def _run(blob: bytes, exercise: str, comm_name: str) -> str:
    """Run on an engine: every case of ``exercise``; return "" or what is wrong on this rank."""
    import cloudpickle
    from IPython import get_ipython

    from course_lib.checks import a6

    comm, fns = get_ipython().user_ns[comm_name], cloudpickle.loads(blob)
    if exercise in ("A6.1", "A6.2"):
        backward = fns[1] if exercise == "A6.2" else None
        cases = [lambda c=c: a6._row_parallel_case(comm, fns[0], backward, *c)
                 for c in a6.ROW_PARALLEL_CASES]  # fmt: skip
        if backward is not None:
            cases.append(lambda: a6._row_parallel_training(comm, *fns))
    elif exercise == "A6.3":
        cases = [lambda k=k, c=c: a6._pipeline_case(comm, fns, *c, seed=k)
                 for k, c in enumerate(a6.PIPELINE_CASES)]  # fmt: skip
    else:
        cases = [lambda: a6._pipeline_training(comm, fns)]
    for case in cases:
        why = a6._agree(comm, case())
        if why:
            return why
    return ""


# -- the check cells ------------------------------------------------------------------------------


def _check(exercise: str, name: str, payload: Any, cluster: Any, detail: str, comm_name: str,
           verbose: bool) -> Verdict:  # fmt: skip
    def body() -> str:
        import cloudpickle

        assert cluster.world_size == 3, f"the check needs 3 engines, not {cluster.world_size}"
        blob = cloudpickle.dumps(payload)  # by value: notebook functions and their helpers
        try:
            reasons = cluster.run(_run, blob, exercise, comm_name, timeout=120)
        except Exception as exc:
            reraise_stub(exc)
            raise
        # A rank that only saw another rank's problem comes last: show the problem itself.
        problems = sorted((w for w in reasons if w), key=lambda w: w.startswith("another rank"))
        assert not problems, problems[0]
        return detail

    return run_check(exercise, name, body, max_points=A6_POINTS[exercise], verbose=verbose)


def check_row_parallel_forward(forward: Callable, cluster: Any, *, comm_name: str = "comm",
                               verbose: bool = True) -> Verdict:  # fmt: skip
    """A6.1: ``forward(ctx, X, W_shard, b, comm, bounds)`` is X @ W.T + b with one allreduce."""
    detail = "3 ranks, 3 shapes (7 inputs split 3, 2, 2), one allreduce of the output"
    return _check("A6.1", "row_parallel_forward", (forward,), cluster, detail, comm_name, verbose)


def check_row_parallel_backward(forward: Callable, backward: Callable, cluster: Any, *,
                                comm_name: str = "comm", verbose: bool = True) -> Verdict:  # fmt: skip
    """A6.2: ``backward(ctx, dY)``: dX, dW_shard, db with one allgather; trains like one process."""
    detail = (f"3 ranks, 3 shapes, dX / dW / db with one allgather, an MLP trained "
              f"{TRAIN_STEPS} steps equal to one process")  # fmt: skip
    return _check("A6.2", "row_parallel_backward", (forward, backward), cluster, detail,
                  comm_name, verbose)  # fmt: skip


def check_gpipe_step(step: Callable, cluster: Any, *, comm_name: str = "comm",
                     verbose: bool = True) -> Verdict:  # fmt: skip
    """A6.3: ``step(comm, stage, X, y, m, shapes)`` is one GPipe step with one-process gradients."""
    cases = ", ".join(f"batch {b} in m = {m}" for b, m in PIPELINE_CASES)
    detail = f"3 stages, {cases}: gradients and loss of one process, neighbours only, F..F B..B"
    return _check("A6.3", "gpipe_step", step, cluster, detail, comm_name, verbose)


def check_gpipe_training(train: Callable, cluster: Any, *, comm_name: str = "comm",
                         verbose: bool = True) -> Verdict:  # fmt: skip
    """A6.4: ``train(comm, stage, batches, lr, m, shapes)`` ends with the weights of one process."""
    detail = f"3 stages, m = 4, {TRAIN_STEPS} SGD steps with momentum: the weights of one process"
    return _check("A6.4", "gpipe_training", train, cluster, detail, comm_name, verbose)
