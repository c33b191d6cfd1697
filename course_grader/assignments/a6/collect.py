"""What A6's checks collect on each engine: the answer's outputs and the counters, as data.

Every engine rebuilds the same inputs from a seed, runs the student's functions with its
communicator and returns what they produced (arrays, the built-in collectives called, the
point-to-point traffic per peer, the order of a stage's passes), never the answer's objects.
The notebook's check cells send :func:`collect` to the engines and judge its data in the kernel
(:mod:`course_grader.assignments.a6.row_parallel`, :mod:`~course_grader.assignments.a6.gpipe`);
the grader ships this module's *source* to the graded engines (``course_lib.checks`` is hidden
there) and judges the same data in its own process. So this module imports nothing from
``course_lib.checks``. The counters are counted inside the student's processes (the grader
also counts the GPipe exercises' bytes on the wire: :mod:`course_grader.verdict.wire`).

Its ``_counters`` and ``_array`` repeat :mod:`course_grader.assignments.a7.collect`'s on purpose:
each module is exec'd alone from its source on the engines, so it shares nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "PIPELINE_WIDTHS",
    "STAGES",
    "TOL",
    "TRAIN_LR",
    "TRAIN_MICROBATCHES",
    "TRAIN_STEPS",
    "case_seed",
    "close",
    "collect",
    "mlp_data",
    "p2p_of",
    "pipeline_batches",
    "pipeline_data",
    "pipeline_model",
    "recorded_stage",
    "row_data",
    "used_of",
]

TRAIN_STEPS, TRAIN_LR = 3, 0.1
TRAIN_MICROBATCHES = 4  # A6.4 trains GPipe with m = 4 micro-batches of 4
PIPELINE_WIDTHS = (6, 10, 7, 4)  # stage s receives micro-batches of PIPELINE_WIDTHS[s] features
STAGES = ((0, 2), (2, 4), (4, 7))


def _gen(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(int(seed))


def row_data(batch: int, d_in: int, d_out: int, seed: int) -> tuple:
    """Return ``X, W, b, G`` of a row-parallel case (``G`` = dL/dY of ``L = sum(Y * G)``)."""
    import torch

    gen = _gen(seed)
    X, W, b = (torch.randn(*s, generator=gen) for s in ((batch, d_in), (d_out, d_in), (d_out,)))
    return X, W, b, torch.randn(batch, d_out, generator=gen)


def mlp_data(seed: int, data_seed: int) -> tuple:
    """Return the weights ``W1, b1, W2, b2`` of the MLP 5-7-3 and its ``TRAIN_STEPS`` batches."""
    import torch

    gen = _gen(seed)
    weights = tuple(torch.randn(*s, generator=gen) for s in ((7, 5), (7,), (3, 7), (3,)))
    gen = _gen(data_seed)
    batches = [
        (torch.randn(8, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        for _ in range(TRAIN_STEPS)
    ]
    return weights, batches


def pipeline_model(seed: int = 6) -> Any:
    """Return the 7-layer MLP the pipeline checks cut into 3 stages (layers 0:2, 2:4, 4:7)."""
    import torch
    from torch import nn

    a, b, c, d = PIPELINE_WIDTHS
    with torch.random.fork_rng():  # the caller's random state stays as it was
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(a, b),
            nn.Tanh(),
            nn.Linear(b, c),
            nn.ReLU(),
            nn.Linear(c, 9),
            nn.Tanh(),
            nn.Linear(9, d),
        )


def pipeline_data(batch: int, seed: int) -> tuple:
    """Return the ``X, y`` of a GPipe step's case."""
    import torch

    gen = _gen(seed)
    X = torch.randn(batch, PIPELINE_WIDTHS[0], generator=gen)
    return X, torch.randint(0, PIPELINE_WIDTHS[-1], (batch,), generator=gen)


def pipeline_batches(seed: int) -> list:
    """Return the ``TRAIN_STEPS`` batches of 16 that GPipe training runs on."""
    import torch

    gen = _gen(seed)
    return [
        (
            torch.randn(16, PIPELINE_WIDTHS[0], generator=gen),
            torch.randint(0, PIPELINE_WIDTHS[-1], (16,), generator=gen),
        )
        for _ in range(TRAIN_STEPS)
    ]


def recorded_stage(model: Any, rank: int, log: list[str]) -> Any:
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


def _counters(comm: Any) -> tuple[list, np.ndarray]:
    """Return the built-ins called [(name, calls, bytes)] (the barrier too: it moves no data,
    and the judges read past it, but its bytes are on the wire), and the traffic per peer
    [(peer, messages sent, bytes sent, messages received, bytes received)]."""
    used, p2p = comm.stats.as_rows()
    return used, np.array(p2p, np.int64).reshape(-1, 5)


def _array(t: Any) -> np.ndarray | None:
    """A tensor's values (None for anything else): what the engine sends back."""
    import torch

    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else None


def _no_backward(ctx: Any, *grads: Any) -> Any:
    raise RuntimeError("A6.1 checks the forward only")


def _function(forward: Callable, backward: Callable | None) -> Any:
    """Return the autograd.Function made of the student's ``forward`` and ``backward``."""
    import torch

    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward or _no_backward)}
    return type("RowParallelLinearFn", (torch.autograd.Function,), methods)


def _row_parallel(comm: Any, fns: tuple, case: dict) -> tuple:
    """A6.1/A6.2 on one shape: (Y, used, p2p) of the forward, then dX, dW, db, used, p2p."""
    from course_lib.comm import chunk_bounds

    X, W, b, G = row_data(case["batch"], case["d_in"], case["d_out"], case["seed"])
    bounds = chunk_bounds(case["d_in"], comm.world_size)
    lo, hi = bounds[comm.rank]
    backward = fns[1] if len(fns) > 1 else None
    fn = _function(fns[0], backward)
    x, w, bias = (t.clone().requires_grad_() for t in (X, W[:, lo:hi], b))
    comm.stats.reset()
    out = fn.apply(x, w, bias, comm, bounds)
    forward = (_array(out), *_counters(comm))
    if backward is None:
        return forward
    comm.stats.reset()
    (out * G).sum().backward()
    return (*forward, _array(x.grad), _array(w.grad), _array(bias.grad), *_counters(comm))


def _row_training(comm: Any, fns: tuple, case: dict) -> tuple:
    """A6.2: the MLP 5-7-3 trained ``TRAIN_STEPS`` SGD steps; its 4 tensors on this rank, then
    the built-ins and the point-to-point traffic of the whole run (the grader's wire check)."""
    import torch
    import torch.nn.functional as F

    from course_lib.comm import chunk_bounds

    (W1, b1, W2, b2), batches = mlp_data(case["seed"], case["data_seed"])
    bounds = chunk_bounds(7, comm.world_size)
    lo, hi = bounds[comm.rank]
    fn = _function(*fns)
    mine = [t.clone().requires_grad_() for t in (W1, b1, W2[:, lo:hi], b2)]
    comm.stats.reset()
    for X, y in batches:
        h = torch.tanh(X @ mine[0].T + mine[1])
        F.cross_entropy(fn.apply(h, mine[2], mine[3], comm, bounds), y).backward()
        with torch.no_grad():
            for t in mine:
                t -= TRAIN_LR * t.grad
                t.grad = None
    return (*(_array(t) for t in mine), *_counters(comm))


def _pipeline(comm: Any, step: Callable, case: dict) -> tuple:
    """A6.3: one GPipe step; (loss, the stage's gradients, used, p2p, the passes' order)."""
    s, p, batch, m = comm.rank, comm.world_size, case["batch"], case["m"]
    log: list[str] = []
    stage = recorded_stage(pipeline_model(case["seed"]), s, log)
    X, y = pipeline_data(batch, case["seed"])
    shapes = [(batch // m, w) for w in PIPELINE_WIDTHS[:p]]
    comm.stats.reset()
    loss = step(comm, stage, X if s == 0 else None, y if s == p - 1 else None, m, shapes)
    used, p2p = _counters(comm)
    grads = [_array(q.grad) for q in stage.parameters()]
    loss = float(loss) if s == p - 1 and loss is not None else None  # only the last stage's
    return loss, grads, used, p2p, " ".join(log)


def _pipeline_training(comm: Any, train: Callable, case: dict) -> tuple:
    """A6.4: ``TRAIN_STEPS`` batches of 16 (m = 4); (used, p2p, the stage's weights)."""
    s, p = comm.rank, comm.world_size
    stage = recorded_stage(pipeline_model(case["model_seed"]), s, [])
    batches = pipeline_batches(case["seed"])
    mine = [(X if s == 0 else None, y if s == p - 1 else None) for X, y in batches]
    comm.stats.reset()
    m = TRAIN_MICROBATCHES
    train(comm, stage, mine, TRAIN_LR, m, [(16 // m, w) for w in PIPELINE_WIDTHS[:p]])
    used, p2p = _counters(comm)
    return used, p2p, [_array(q) for q in stage.parameters()]


def collect(comm: Any, fns: Any, case: dict) -> tuple:
    """Run one case of A6 (``case["kind"]``) on this rank; return (rank, world size, data)."""
    run = {
        "row": _row_parallel,
        "row_training": _row_training,
        "pipeline": _pipeline,
        "pipeline_training": _pipeline_training,
    }[case["kind"]]
    return comm.rank, comm.world_size, run(comm, fns, case)


# -- what A6's judges share: the tolerance, the engines' counters as dicts, the seeds ---------
TOL = {"rtol": 1e-4, "atol": 1e-5}


def case_seed(default: int, seed: int | None) -> int:
    """The checks' own seed (``seed`` None, as in the notebook), or one from the grader's."""
    return default if seed is None else (int(seed) * 1_000_003 + default) % 2**62


def used_of(used: Any) -> dict[str, tuple[int, int]]:
    """Return {collective: (calls, bytes)} from an engine's [(name, calls, bytes)], barrier aside."""
    return {str(n): (int(c), int(b)) for n, c, b in used if str(n) != "barrier"}


def p2p_of(p2p: Any) -> dict[int, tuple[int, int, int, int]]:
    """Return {peer: (messages sent, bytes sent, messages received, bytes received)}."""
    rows = np.asarray(p2p, np.int64).reshape(-1, 5)
    return {int(r[0]): tuple(int(v) for v in r[1:]) for r in rows}


def close(got: Any, want: Any) -> bool:
    """Return whether ``got`` has ``want``'s shape and values (within :data:`TOL`)."""
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    if not isinstance(got, np.ndarray) or got.dtype.kind not in "fiu":
        return False
    return got.shape == want.shape and bool(np.allclose(got, want, **TOL))
