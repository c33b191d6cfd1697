"""What A7's checks collect on each engine: the answer's outputs, the counters, the ledger, as data.

Every engine rebuilds the same inputs from a seed, runs the student's functions with its
communicator and returns what they produced, never the answer's objects:

- A7.1 (gradient hooks): the student's hooks are attached to a 3-layer MLP whose parameters
  form 3 buckets; the engine runs two backward passes on its own samples and returns the shards
  the hooks stored after each, and a **memory ledger** sampled during backward: at every
  parameter's gradient (the harness's own hook runs after the student's), the bytes of full-size
  gradients still held, bucket by bucket (every ``.grad``), the bytes the shards dict holds, and
  the collectives called so far;
- A7.2 (the shard's update): ``TRAIN_STEPS`` updates of a bucket from shared gradient shards;
  the flat weights after them and the bytes of optimiser state kept.

The notebook's check cells send :func:`collect` to the engines and judge its data in the
kernel (:mod:`course_grader.assignments.a7.judge`); the grader ships this module's *source* to
the graded engines (``course_lib.checks`` is hidden there) and judges the same data in its own
process. So this module imports nothing from ``course_lib.checks``. The counters and the ledger
are counted inside the student's processes (the grader also counts the bytes on the wire:
:mod:`course_grader.verdict.wire`). Not closed: a full gradient copied into a variable of the
answer's own (not ``.grad``, not the shards dict) escapes the ledger.

Copied on purpose from :mod:`course_grader.assignments.a6.collect`: ``_counters``, ``_array``
(the engines exec each collect module alone, from its source; it can import no sibling).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "ADAM_LR",
    "BACKWARDS",
    "PER_RANK",
    "TRAIN_STEPS",
    "bucket",
    "collect",
    "hook_model",
    "model_buckets",
    "p2p_of",
    "rank_batch",
    "state_bytes",
    "used_of",
]

TRAIN_STEPS, ADAM_LR = 3, 0.01
BACKWARDS = 2  # A7.1: backward passes a case (the hooks must count each pass afresh)
PER_RANK = 4  # A7.1: samples a rank's batch holds


def _gen(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(int(seed) % 2**62)


def bucket(m: int, seed: int, who: int = -1) -> Any:
    """Return ``m`` float32 values from ``seed`` (``who``: a rank's own; -1: the shared ones)."""
    import torch

    return torch.randn(m, generator=_gen(seed * 31 + 7919 * (who + 1)))


def hook_model(seed: int) -> Any:
    """A7.1's model: Linear(4, 7), Tanh, Linear(7, 5), Tanh, Linear(5, 2): buckets of 12, 40, 35."""
    import torch
    from torch import nn

    with torch.random.fork_rng():  # the caller's random state stays as it was
        torch.manual_seed(int(seed))
        return nn.Sequential(
            nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 2)
        )


def model_buckets(model: Any) -> list[list[Any]]:
    """The buckets in the order backward produces them: one a layer, the last layer's first."""
    return [list(layer.parameters()) for layer in reversed(model) if list(layer.parameters())]


def rank_batch(seed: int, step: int, rank: int) -> tuple[Any, Any]:
    """Rank ``rank``'s samples ``(X, y)`` for backward pass ``step`` of A7.1."""
    import torch

    gen = _gen(seed * 7 + 1009 * step + 13 * rank)
    return torch.randn(PER_RANK, 4, generator=gen), torch.randint(0, 2, (PER_RANK,), generator=gen)


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


def state_bytes(state: Any, weights: Any = None) -> int:
    """The ledger: bytes of the storages ``state`` keeps, each once, the weights' own excepted.

    A tensor that views a bigger buffer keeps the whole buffer alive, so storages are counted,
    not views. A parameter that views the flat weights (an optimiser's shard) is the weights, not
    state; Adam's moments and anything else the answer keeps between steps count.
    """
    from course_lib.parallel.sharded.ledger import held_bytes

    tensors: list = []
    _state_tensors(state, tensors)
    seen = set() if weights is None else {weights.untyped_storage().data_ptr()}
    return held_bytes(tensors, seen)


def _calls(comm: Any) -> int:
    """The built-in collectives called so far (the barrier aside) and the messages sent."""
    used, p2p = comm.stats.as_rows()
    return sum(c for n, c, _ in used if n != "barrier") + sum(row[1] for row in p2p)


def _hooks(comm: Any, fn: Callable, case: dict) -> tuple:
    """A7.1: the answer's hooks over two backward passes; (shards, ledger rows, used, p2p).

    Ledger rows, one per parameter's gradient: (pass, bucket of that parameter, full-size
    gradient bytes held by each bucket's ``.grad``..., bytes held by the shards dict,
    collectives and messages so far).
    """
    import torch.nn.functional as F

    model = hook_model(case["model_seed"])
    buckets = model_buckets(model)
    shards: dict = {}
    rows: list[list[int]] = []
    step = [0]
    comm.stats.reset()
    fn(comm, buckets, shards)

    def sample(b: int) -> Callable:
        def hook(_p: Any) -> None:  # runs after the answer's own hook of the same parameter
            held = [sum(4 * q.grad.numel() for q in ps if q.grad is not None) for ps in buckets]
            rows.append([step[0], b, *held, state_bytes(shards), _calls(comm)])

        return hook

    handles = [p.register_post_accumulate_grad_hook(sample(b))
               for b, ps in enumerate(buckets) for p in ps]  # fmt: skip
    got = []
    for step[0] in range(BACKWARDS):
        X, y = rank_batch(case["seed"], step[0], comm.rank)
        F.cross_entropy(model(X), y).backward()
        held = [sum(4 * q.grad.numel() for q in ps if q.grad is not None) for ps in buckets]
        rows.append([step[0], len(buckets), *held, state_bytes(shards), _calls(comm)])
        got.append([_array(shards.get(b)) for b in range(len(buckets))])
        shards.clear()  # the next pass's shards are its own
        for p in model.parameters():  # as zero_grad(set_to_none=True): each pass from nothing
            p.grad = None
    for handle in handles:
        handle.remove()
    return got, np.array(rows, np.int64), *_counters(comm)


def _update(comm: Any, fn: Callable, case: dict) -> tuple:
    """A7.2: ``TRAIN_STEPS`` updates of a bucket from its gradient shards; (weights, state bytes,
    used, p2p)."""
    from course_lib.comm import chunk_bounds

    m, seed = case["m"], case["seed"]
    lo, hi = chunk_bounds(m, comm.world_size)[comm.rank]
    weights, state = bucket(m, seed), {}
    comm.stats.reset()
    for t in range(TRAIN_STEPS):
        fn(comm, weights, bucket(m, seed + 1 + t)[lo:hi].clone(), state, ADAM_LR)
    return _array(weights), state_bytes(state, weights), *_counters(comm)


def collect(comm: Any, fn: Any, case: dict) -> tuple:
    """Run one case of A7 (``case["kind"]``) on this rank; return (rank, world size, data)."""
    run = {"hooks": _hooks, "update": _update}[case["kind"]]
    return comm.rank, comm.world_size, run(comm, fn, case)


# -- what A7's judge shares: the engines' counters as dicts -----------------------------------
def used_of(used: Any) -> dict[str, tuple[int, int]]:
    """Return {collective: (calls, bytes)} from an engine's [(name, calls, bytes)], barrier aside."""
    return {str(n): (int(c), int(b)) for n, c, b in used if str(n) != "barrier"}


def p2p_of(p2p: Any) -> dict[int, tuple[int, int, int, int]]:
    """Return {peer: (messages sent, bytes sent, messages received, bytes received)}."""
    rows = np.asarray(p2p, np.int64).reshape(-1, 5)
    return {int(r[0]): tuple(int(v) for v in r[1:]) for r in rows}
