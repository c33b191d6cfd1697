"""What A7's checks collect on each engine: the answer's outputs, the counters, the ledger, as data.

Every engine rebuilds the same inputs from a seed, runs the student's functions with its
communicator and returns what they produced (this rank's shard, the flat weights after the
update, the bytes of optimiser state the answer keeps, the built-in collectives called and the
point-to-point traffic per peer), never the answer's objects. The notebook's check cells send
:func:`collect` to the engines and judge its data in the kernel
(:mod:`course_grader.assignments.a7.judge`); the grader ships this module's *source* to
the graded engines (``course_lib.checks`` is hidden there) and judges the same data in its own
process. So this module imports nothing from ``course_lib.checks``. The counters and the
ledger are counted inside the student's processes (the grader also counts the bytes on the
wire: :mod:`course_grader.verdict.wire`).

Copied on purpose from :mod:`course_grader.assignments.a6.collect`: ``_counters``, ``_array``
(the engines exec each collect module alone, from its source; it can import no sibling).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "ADAM_LR",
    "TRAIN_STEPS",
    "bucket",
    "collect",
    "global_batches",
    "model_buckets",
    "p2p_of",
    "stage2_model",
    "state_bytes",
    "used_of",
]

TRAIN_STEPS, ADAM_LR = 3, 0.01
BATCH = 12  # A7.4's global batch: 4 samples a rank on 3 ranks


def _gen(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(int(seed) % 2**62)


def bucket(m: int, seed: int, who: int = -1) -> Any:
    """Return ``m`` float32 values from ``seed`` (``who``: a rank's own; -1: the shared ones)."""
    import torch

    return torch.randn(m, generator=_gen(seed * 31 + 7919 * (who + 1)))


def stage2_model(seed: int) -> Any:
    """Return A7.4's model: Linear(4, 7), Tanh, Linear(7, 2) (buckets of 16 and 35 values)."""
    import torch
    from torch import nn

    with torch.random.fork_rng():  # the caller's random state stays as it was
        torch.manual_seed(int(seed))
        return nn.Sequential(nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, 2))


def model_buckets(model: Any) -> list[list[Any]]:
    """The buckets in the order backward produces them: the last layer's, then the first's."""
    return [list(model[2].parameters()), list(model[0].parameters())]


def flatten_into_buckets(model: Any) -> list[Any]:
    """Make every parameter a view of its bucket's flat float32 buffer; return the buffers."""
    import torch

    flats = []
    for params in model_buckets(model):
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        start = 0
        for p in params:
            p.data = flat[start : start + p.numel()].view_as(p)
            start += p.numel()
        flats.append(flat)
    return flats


def global_batches(seed: int) -> list[tuple[Any, Any]]:
    """Return A7.4's ``TRAIN_STEPS`` global batches ``(X, y)`` of ``BATCH`` samples."""
    import torch

    gen = _gen(seed)
    return [
        (torch.randn(BATCH, 4, generator=gen), torch.randint(0, 2, (BATCH,), generator=gen))
        for _ in range(TRAIN_STEPS)
    ]


def local_gradients(model: Any, X: Any, y: Any) -> list[Any]:
    """Return this batch's mean-loss gradient as one flat tensor per bucket (and free .grad)."""
    import torch
    import torch.nn.functional as F

    F.cross_entropy(model(X), y).backward()
    flats = []
    for params in model_buckets(model):
        flats.append(torch.cat([p.grad.reshape(-1) for p in params]))
        for p in params:
            p.grad = None
    return flats


def _counters(comm: Any) -> tuple[list, np.ndarray]:
    """Return the built-ins called [(name, calls, bytes)] (the barrier too: it moves no data,
    and the judges read past it, but its bytes are on the wire), and the traffic per peer
    [(peer, messages sent, bytes sent, messages received, bytes received)]."""
    used, p2p = comm.stats.as_rows()
    return used, np.array(p2p, np.int64).reshape(-1, 5)


def _array(t: Any) -> np.ndarray | None:
    """A tensor's values (None for anything else): what the engine sends back."""
    import torch

    return t.detach().cpu().numpy().copy() if isinstance(t, torch.Tensor) else None


def _state_tensors(obj: Any, out: list, depth: int = 0) -> None:
    """Collect the tensors an answer's state holds: its own, and its optimisers' state."""
    import torch

    if depth > 8:
        return
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():
            _state_tensors(state, out, depth + 1)
    elif isinstance(obj, dict):
        for value in obj.values():
            _state_tensors(value, out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _state_tensors(value, out, depth + 1)


def state_bytes(state: Any, weights: Any) -> int:
    """The ledger: bytes of the storages ``state`` keeps, each once, the weights' own excepted.

    A parameter that views the flat weights (an optimiser's shard) is the weights, not state;
    Adam's moments and anything else the answer keeps between steps count.
    """
    from course_lib.parallel.sharded.ledger import held_bytes

    tensors: list = []
    _state_tensors(state, tensors)
    return held_bytes(tensors, {weights.untyped_storage().data_ptr()})


def _reduce_scatter(comm: Any, fn: Callable, case: dict) -> tuple:
    """A7.1: this rank's bucket reduce-scattered; (shard, used, p2p)."""
    flat = bucket(case["m"], case["seed"], comm.rank)
    comm.stats.reset()
    out = fn(comm, flat)
    return (_array(out), *_counters(comm))


def _adam(comm: Any, fn: Callable, case: dict) -> tuple:
    """A7.2: ``TRAIN_STEPS`` Adam updates of this rank's shard; (weights, state bytes, used, p2p)."""
    from course_lib.comm import chunk_bounds

    m, seed = case["m"], case["seed"]
    lo, hi = chunk_bounds(m, comm.world_size)[comm.rank]
    weights, state = bucket(m, seed), {}
    comm.stats.reset()
    for t in range(TRAIN_STEPS):
        fn(weights, bucket(m, seed + 1 + t)[lo:hi].clone(), state, comm, ADAM_LR)
    return _array(weights), state_bytes(state, weights), *_counters(comm)


def _allgather(comm: Any, fn: Callable, case: dict) -> tuple:
    """A7.3: the stale weights with this rank's shard updated, gathered; (flat, returned, used, p2p)."""
    from course_lib.comm import chunk_bounds

    m, seed = case["m"], case["seed"]
    lo, hi = chunk_bounds(m, comm.world_size)[comm.rank]
    flat = bucket(m, seed + 1)  # the weights before the step
    flat[lo:hi] = bucket(m, seed)[lo:hi]  # this rank's shard, updated
    comm.stats.reset()
    out = fn(comm, flat)
    return (_array(flat), _array(out), *_counters(comm))


def _stage2(comm: Any, fn: Callable, case: dict) -> tuple:
    """A7.4: ``TRAIN_STEPS`` stage-2 steps, bucket by bucket; (flats, state bytes, used, p2p)."""
    model = stage2_model(case["model_seed"])
    flats = flatten_into_buckets(model)
    states: list[dict] = [{} for _ in flats]
    per = BATCH // comm.world_size
    lo, hi = comm.rank * per, (comm.rank + 1) * per
    comm.stats.reset()
    for X, y in global_batches(case["seed"]):
        grads = local_gradients(model, X[lo:hi], y[lo:hi])
        for flat, grad, state in zip(flats, grads, states, strict=True):
            fn(comm, flat, grad, state, ADAM_LR)
        del grads  # stage 2: the full gradients are gone once reduce-scattered
    held = [state_bytes(s, f) for s, f in zip(states, flats, strict=True)]
    return [_array(f) for f in flats], held, *_counters(comm)


def collect(comm: Any, fn: Any, case: dict) -> tuple:
    """Run one case of A7 (``case["kind"]``) on this rank; return (rank, world size, data)."""
    run = {"rs": _reduce_scatter, "adam": _adam, "ag": _allgather, "stage2": _stage2}[case["kind"]]
    return comm.rank, comm.world_size, run(comm, fn, case)


# -- what A7's judge shares: the engines' counters as dicts -----------------------------------
def used_of(used: Any) -> dict[str, tuple[int, int]]:
    """Return {collective: (calls, bytes)} from an engine's [(name, calls, bytes)], barrier aside."""
    return {str(n): (int(c), int(b)) for n, c, b in used if str(n) != "barrier"}


def p2p_of(p2p: Any) -> dict[int, tuple[int, int, int, int]]:
    """Return {peer: (messages sent, bytes sent, messages received, bytes received)}."""
    rows = np.asarray(p2p, np.int64).reshape(-1, 5)
    return {int(r[0]): tuple(int(v) for v in r[1:]) for r in rows}
