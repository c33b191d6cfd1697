"""Lecture 15: TinyGPT on a 3D grid beside one process, with bytes per axis and memory per rank by formula.

:func:`compare_grid_with_one_process` trains one TinyGPT and its 3D copy
(:mod:`course_lib.parallel.grid.gpt3d`) 3 Adam steps on the same batches and returns how far
apart they are, what each axis's communicator counted in the first step beside
:func:`grid_traffic`, and the model state this rank holds beside :func:`grid_state_bytes`.
Adam's ``eps`` is 1e-6, as in :mod:`course_lib.parallel.transformer.equality` (why: there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.parallel.grid.gpt3d import GridStage, grid_forward, grid_train_step
from course_lib.parallel.grid.mesh import ProcessGrid
from course_lib.parallel.model_parallel.tensor_parallel import shard_bounds
from course_lib.parallel.pipeline_parallel.pipeline import PipelineSettings, even_stages
from course_lib.parallel.transformer.formulas import FLOAT
from course_lib.training.transformer import TinyGPT

__all__ = ["GRID_SIZES", "compare_grid_with_one_process", "grid_state_bytes", "grid_traffic"]

#: A TinyGPT small enough for 8 engines on 2 cores: 4 heads, 2 blocks (one per stage of 2).
GRID_SIZES = {"vocab": 21, "block": 8, "d_model": 16, "n_head": 4, "n_layer": 2}
_SHAPE_HEADER = 64  # the pipeline's first message across a boundary: its shape, 8 int64


def _dims(grid_dims: dict[str, int]) -> tuple[int, int, int]:
    return grid_dims["data"], grid_dims["pipeline"], grid_dims["tensor"]


def grid_traffic(
    sizes: dict, batch: int, length: int, grid_dims: dict[str, int], coords: dict[str, int],
    num_microbatches: int,
) -> dict[str, dict[str, tuple[int, int]]]:  # fmt: skip
    """Return, per axis, ``{what: (calls or messages, bytes)}`` one step sends from rank ``coords``.

    With $b = B/(d\\,m)$ sequences per micro-batch and $a = bTd$ floats of activation:
    tensor: per micro-batch $4L_s$ allreduces of $a$ (2 per block each way), one more for the
    embedding (first stage) and one for the head's input (last), and 3 of $bT$ for the loss;
    pipeline: $m$ activations forward (all but the last stage, after a 64-byte shape header)
    and $m$ gradients backward (all but the first); data: one allreduce of the rank's shard.
    """
    dp, pp, tp = _dims(grid_dims)
    s, m = coords["pipeline"], num_microbatches
    first, last = s == 0, s == pp - 1
    a, b = even_stages(sizes["n_layer"], pp)[s]
    act = batch // (dp * m) * length * sizes["d_model"] * FLOAT
    loss = batch // (dp * m) * length * FLOAT
    n = 4 * (b - a) + first + last
    sent = (0 if last else m * act + _SHAPE_HEADER) + (0 if first else m * act)
    return {
        "tensor": {"allreduce": (m * (n + 3 * last), m * (n * act + 3 * last * loss))},
        "pipeline": {"p2p": (m * (2 - first - last) + (not last), sent)},
        "data": {"allreduce": (1, grid_params(sizes, grid_dims, coords) * FLOAT)},
    }


def grid_params(sizes: dict, grid_dims: dict[str, int], coords: dict[str, int]) -> int:
    """Return the parameters rank ``coords`` holds: its stage's blocks cut by tensor rank, and ends.

    A block keeps its heads' share of Q, K, V and of the output projection's columns, its
    share of the MLP's hidden layer, and whole copies of the biases added after a reduction
    and of both LayerNorms; the first stage the embedding rows of its vocabulary share and the
    positions, the last the final LayerNorm and its share of the output layer.
    """
    _, pp, tp = _dims(grid_dims)
    d, heads, r, s = sizes["d_model"], sizes["n_head"], coords["tensor"], coords["pipeline"]
    h0, h1 = shard_bounds(heads, tp, "attention heads")[r]
    cols = (h1 - h0) * d // heads
    m0, m1 = shard_bounds(4 * d, tp, "MLP hidden layer")[r]
    hidden = m1 - m0
    v0, v1 = shard_bounds(sizes["vocab"], tp, "vocabulary")[r]
    a, b = even_stages(sizes["n_layer"], pp)[s]
    block = 4 * cols * d + 3 * cols + d + 2 * hidden * d + hidden + d + 4 * d
    ends = (s == 0) * ((v1 - v0) * d + sizes["block"] * d)
    ends += (s == pp - 1) * (2 * d + (v1 - v0) * (d + 1))
    return (b - a) * block + ends


def grid_state_bytes(sizes: dict, grid_dims: dict[str, int], coords: dict[str, int]) -> int:
    """Return rank ``coords``'s model state with float32 Adam: 16 bytes per parameter it holds
    (weight, gradient, two moments; nothing sharded along the data axis, as plain DDP)."""
    return 4 * FLOAT * grid_params(sizes, grid_dims, coords)


def _state_measured(stage: GridStage, opt: torch.optim.Optimizer) -> int:
    total = 0
    for p in stage.parameters():
        total += p.nbytes + (p.grad.nbytes if p.grad is not None else 0)
        total += sum(v.nbytes for k, v in opt.state[p].items() if k != "step")
    return total


def compare_grid_with_one_process(
    grid: ProcessGrid,
    batch: int = 4,
    length: int = 8,
    steps: int = 3,
    num_microbatches: int = 2,
    sizes: dict | None = None,
) -> dict:
    """Train TinyGPT on ``grid`` (axes data, pipeline, tensor) and in one process; return the gaps.

    Every rank of the grid calls it. ``forward``: the last stage's full logits of its replica's
    share against one process (relative, None on other stages); ``grads``: each local gradient
    of the first step against one process's (relative per tensor); ``weights``: every local
    weight after ``steps`` Adam steps against the same part of the one-process model (relative
    to its largest weight); ``counted`` / ``formula``: per axis, the first step's calls and
    bytes; ``state`` / ``state_formula``: this rank's model-state bytes.
    """
    sizes = {**GRID_SIZES, **(sizes or {})}
    dims = dict(zip(grid.names, grid.dims, strict=True))
    dp, rank_dp = dims["data"], grid.coords["data"]
    torch.manual_seed(0)  # the same model and batches on every rank
    ref = TinyGPT(**sizes)
    X = torch.randint(0, sizes["vocab"], (steps, batch, length))
    Y = torch.randint(0, sizes["vocab"], (steps, batch, length))
    stage = GridStage(ref, grid)  # after the batches: stages draw different initial values
    share = slice(rank_dp * batch // dp, (rank_dp + 1) * batch // dp)  # this replica's sequences
    with torch.no_grad():
        logits = grid_forward(stage, grid, X[0, share])
        want = ref(X[0, share])
    row: dict = {"coords": dict(grid.coords), "forward": None}
    if logits is not None:
        row["forward"] = ((logits - want).abs().max() / want.abs().max()).item()
    settings = PipelineSettings("1f1b", num_microbatches, batch // dp)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-6) for m in (ref, stage)]
    for step in range(steps):
        for opt in opts:
            opt.zero_grad()
        F.cross_entropy(ref(X[step]), Y[step]).backward()
        for axis in grid.names:
            grid[axis].stats.reset()
        grid_train_step(stage, grid, settings, X[step, share], Y[step, share])
        if step == 0:
            row["counted"] = {
                axis: {k: (v.calls, v.bytes) for k, v in grid[axis].stats.collectives.items()}
                for axis in ("tensor", "data")
            }
            grads = {n: p.grad for n, p in ref.named_parameters()}
            row["grads"] = {
                n: (
                    (p.grad - stage.shard_of(n, grads)).abs().max()
                    / stage.shard_of(n, grads).abs().max().clamp_min(1e-30)
                ).item()
                for n, p in stage.named_parameters()
            }
            pipe = grid["pipeline"].stats
            row["counted"]["pipeline"] = {"p2p": (pipe.messages_sent, pipe.bytes_sent)}
        for opt in opts:
            opt.step()
    full = ref.state_dict()
    largest = max(w.abs().max() for w in full.values())
    gaps = {
        n: ((p - stage.shard_of(n, full)).abs().max() / largest).item()
        for n, p in stage.named_parameters()
    }
    row["weights"], row["worst"] = max((v, k) for k, v in gaps.items())
    row["formula"] = grid_traffic(sizes, batch, length, dims, grid.coords, num_microbatches)
    row["state"] = _state_measured(stage, opts[1])
    row["state_formula"] = grid_state_bytes(sizes, dims, grid.coords)
    return row
