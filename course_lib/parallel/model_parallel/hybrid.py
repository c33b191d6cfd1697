"""Lecture 9: Krizhevsky's hybrid: data-parallel convolutions, model-parallel dense layers (source 004).

Krizhevsky (2014), "One weird trick for parallelizing convolutional neural networks"
(arXiv:1404.5997), starts from two facts about CNNs: the convolutional layers hold few weights
but do most of the arithmetic, the fully-connected (dense) layers hold most of the weights but
do little arithmetic. So the convolutions should be **data parallel** (weights are cheap to
synchronise, activations expensive to move) and the dense layers **model parallel** (weights
expensive to synchronise, the activations of a batch are small). One step on ``N`` engines:

1. each engine runs the convolutions on its own ``B/N`` samples;
2. the last convolutional features are **all-gathered**: every engine holds all ``B`` samples'
   features (and labels);
3. the dense layers are split by neurons over the engines (the Megatron column -> row pairs of
   :mod:`course_lib.parallel.model_parallel.tensor_parallel`), forward and backward on the whole batch;
4. each engine's dL/d(features) holds only its own neurons' share: a **reduce-scatter** sums
   the shares and hands each engine the rows of its own samples;
5. backward through the convolutions on the own samples, then the convolutions' gradients are
   **allreduced** (summed) as in data parallelism; the dense weights are never exchanged.

The paper describes three ways to do step 2 for K workers: (a) every worker sends its features
to every other one and the dense layers run once on the big batch; (b) one worker at a time
sends its features, and the dense layers run on that part while the next part travels; (c)
every worker sends a K-th of its features at a time, then as (b). **This module implements
variant (a)**, the simplest: its step equals one process training the same model on the whole
batch. Variants (b) and (c) send the same features in K rounds so that communication overlaps
the dense layers' computation.

Every collective here goes round the ring from point-to-point messages (``course_lib.collectives``),
so the communicator's per-peer counters show the bytes really sent; :func:`hybrid_bytes` gives
them per part and :func:`crossover_batch` the batch size below which the hybrid sends less than
pure data parallelism (whose bytes do not depend on the batch).

Kept whole: one algorithm, the hybrid step and the byte counts that say when it pays.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from course_lib.collectives.ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from course_lib.comm.communicator import Communicator
from course_lib.parallel.model_parallel.tensor_parallel import (
    ColumnParallelLinear,
    TensorParallelMLP,
)

__all__ = [
    "HybridCNN",
    "HybridStep",
    "RingCollectives",
    "crossover_batch",
    "data_parallel_bytes",
    "dense_params",
    "gather_batch",
    "hybrid_bytes",
    "hybrid_collectives",
    "hybrid_step",
    "layer_sizes",
    "scatter_batch_grad",
    "shard_batch",
    "split_cnn",
]

PARTS = ("conv gradients", "features", "labels", "dense head")  # what a step sends, by part


def split_cnn(net: nn.Sequential) -> tuple[nn.Sequential, nn.Sequential]:
    """Return (convolutions up to and with the Flatten, dense head after it) of a Sequential CNN."""
    modules = list(net)
    flat = [i for i, m in enumerate(modules) if isinstance(m, nn.Flatten)]
    head = modules[flat[0] + 1 :] if flat else []
    if not flat or not any(isinstance(m, nn.Linear) for m in head):
        raise ValueError(
            f"{type(net).__name__} has no nn.Flatten followed by nn.Linear layers: the hybrid "
            "needs a Sequential CNN like course_lib.training.models.LeNet (convolutions, Flatten, dense)"
        )
    bad = [type(m).__name__ for m in head if not isinstance(m, (nn.Linear, nn.ReLU))]
    if bad:
        raise ValueError(
            f"the dense head may hold only Linear and ReLU layers, found {bad}; move other "
            "layers before the Flatten"
        )
    return nn.Sequential(*modules[: flat[0] + 1]), nn.Sequential(*head)


def layer_sizes(net: nn.Sequential) -> tuple[int, list[int]]:
    """Return (convolution parameters, dense widths [features, hidden..., classes]) of a CNN."""
    convs, head = split_cnn(net)
    linears = [m for m in head if isinstance(m, nn.Linear)]
    widths = [linears[0].in_features] + [m.out_features for m in linears]
    return sum(p.numel() for p in convs.parameters()), widths


class RingCollectives:
    """``comm`` seen by the tensor-parallel layers, with allreduce / allgather round the ring.

    The layers call ``rank``, ``world_size``, ``allreduce`` and ``allgather``; here those go
    point-to-point (``course_lib.collectives.ring``), so the per-peer counters show the bytes
    on the wire and ``seconds`` the time spent in them.
    """

    def __init__(self, comm: Communicator) -> None:
        self.comm, self.rank, self.world_size = comm, comm.rank, comm.world_size
        self.seconds = 0.0

    def allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` (contiguous) over ranks in place, round the ring; return it."""
        t0 = time.perf_counter()
        ring_allreduce(self.comm, tensor)
        self.seconds += time.perf_counter() - t0
        return tensor

    def allgather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return a new ``(world_size, *shape)`` tensor of every rank's ``tensor``."""
        t0 = time.perf_counter()
        rows = torch.zeros((self.world_size, *tensor.shape), dtype=tensor.dtype)
        rows[self.rank] = tensor
        ring_allgather(self.comm, rows)  # chunk r of the flat buffer is exactly rank r's row
        self.seconds += time.perf_counter() - t0
        return rows


def shard_batch(X: torch.Tensor, y: torch.Tensor, comm: Communicator):
    """Return this rank's ``B/N`` consecutive samples of a batch (X, y) that every rank holds."""
    batch, p = len(X), comm.world_size
    if batch % p:
        raise ValueError(
            f"a batch of {batch} samples does not split over {p} ranks: the hybrid gathers "
            f"equal shards; use a batch that is a multiple of {p} (e.g. {batch - batch % p} "
            f"or {batch + p - batch % p})"
        )
    a, b = comm.rank * batch // p, (comm.rank + 1) * batch // p
    return X[a:b], y[a:b]


def gather_batch(comm: Communicator, shard: torch.Tensor) -> torch.Tensor:
    """Return every rank's equal ``shard`` stacked along the batch: ``(N * b, ...)``, rank order."""
    rows = torch.zeros((comm.world_size, *shard.shape), dtype=shard.dtype)
    rows[comm.rank] = shard
    ring_allgather(comm, rows)
    return rows.reshape(-1, *shard.shape[1:])


def scatter_batch_grad(comm: Communicator, grad: torch.Tensor) -> torch.Tensor:
    """Return the sum over ranks of ``grad`` (whole batch), rows of this rank's samples only."""
    total = grad.contiguous().clone()
    ring_reduce_scatter(comm, total)  # chunk r (rank r's rows) now holds the complete sum
    b = len(total) // comm.world_size
    return total[comm.rank * b : (comm.rank + 1) * b]


class HybridCNN(nn.Module):
    """This rank's part of a Sequential CNN: all of the convolutions, its neurons of the dense layers.

    Built from the same full ``net`` on every rank (same seed): the convolutions are copied whole
    (data parallel), the dense layers become column -> row parallel pairs over ``comm``.
    """

    def __init__(self, net: nn.Sequential, comm: Communicator) -> None:
        super().__init__()
        convs, head = split_cnn(net)
        self.comm, self.ring = comm, RingCollectives(comm)
        self.convs = copy.deepcopy(convs)
        self.head = TensorParallelMLP(head, self.ring)  # widths < N raise, naming the fix
        first = next(m for m in self.head if isinstance(m, ColumnParallelLinear))
        first.reduce_input_grad = False  # step 4's reduce-scatter sums dL/d(features) instead

    def conv_parameters(self) -> list[nn.Parameter]:
        """Return the data-parallel (replicated) parameters: the convolutions'."""
        return list(self.convs.parameters())


@dataclass
class HybridStep:
    """One hybrid step on one rank: the loss, and per part the bytes sent and seconds taken."""

    loss: float
    bytes: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _sent(comm: Communicator) -> int:
    return comm.stats.bytes_sent


def hybrid_step(
    net: HybridCNN,
    X_shard: torch.Tensor,
    y_shard: torch.Tensor,
    loss_fn: Callable = nn.functional.cross_entropy,
) -> HybridStep:
    """Run forward and backward of one hybrid step; leave every ``p.grad`` equal to one process's.

    Every rank calls it with its own equal shard (see :func:`shard_batch`); afterwards each
    rank's gradients are those of ``loss_fn`` (a mean) over the WHOLE batch, so any optimiser
    step keeps the ranks' convolutions identical. Gradients are set, not accumulated.
    """
    comm, out = net.comm, HybridStep(0.0, dict.fromkeys(PARTS, 0), dict.fromkeys(PARTS, 0.0))
    sizes = comm.allgather(np.array([len(X_shard), len(y_shard)], np.int64))
    if len({tuple(s) for s in sizes}) != 1 or sizes[0][0] != sizes[0][1]:
        raise ValueError(
            f"rank {comm.rank}: every rank needs an equal shard of samples and labels, got "
            f"(samples, labels) {[tuple(int(v) for v in s) for s in sizes]}; cut the batch with "
            "shard_batch(X, y, comm), which needs a batch that is a multiple of the ranks"
        )
    net.zero_grad(set_to_none=True)

    def part(name: str, fn: Callable, *args):
        sent, t0 = _sent(comm), time.perf_counter()
        result = fn(*args)
        out.bytes[name] += _sent(comm) - sent
        out.seconds[name] += time.perf_counter() - t0
        return result

    features = net.convs(X_shard)  # 1. data parallel: own samples only
    whole = part("features", gather_batch, comm, features.detach().contiguous())  # 2.
    y_all = part("labels", gather_batch, comm, y_shard.contiguous())
    whole.requires_grad_()
    net.ring.seconds = 0.0
    sent = _sent(comm)
    loss = loss_fn(net.head(whole), y_all)  # 3. the mean over all B samples, on every rank
    loss.backward()
    out.bytes["dense head"], out.seconds["dense head"] = _sent(comm) - sent, net.ring.seconds
    own_grad = part("features", scatter_batch_grad, comm, whole.grad)  # 4.
    if features.requires_grad:  # an MLP's "convolutions" are a Flatten: nothing to backward
        features.backward(own_grad)  # 5. convolutions' gradients: own samples' share of the mean
    params = [p for p in net.conv_parameters() if p.grad is not None]
    if not params:
        out.loss = float(loss.detach())
        return out
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    # a SUM, not a mean: each share is already divided by the whole batch size B
    part("conv gradients", ring_allreduce, comm, flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    out.loss = float(loss.detach())
    return out


# ---- the cost model: bytes each rank sends per step, averaged over ranks ----------------------
def dense_params(widths: list[int]) -> int:
    """Return the weights and biases of dense layers ``widths[0] -> widths[1] -> ...``."""
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))


def data_parallel_bytes(params: int, world_size: int) -> float:
    """Return the bytes per rank of pure data parallelism: a ring allreduce of every gradient.

    $2\\frac{N-1}{N} \\cdot 4P$, whatever the batch size.
    """
    return 2 * (world_size - 1) / world_size * 4 * params


def hybrid_collectives(batch: int, world_size: int, conv_params: int, widths: list[int]) -> dict:
    """Return per part the ``(algorithm, buffer bytes)`` of every collective in one hybrid step.

    Algorithms are names in ``course_lib.cost_model.alpha_beta.ALGORITHMS``, so ``predict`` gives their
    time. Dense widths are $w_0$ (features) ... $w_L$ (classes); every row-parallel layer
    allreduces its $B \\times w_{out}$ output (forward), every column-parallel layer after the
    first its $B \\times w_{in}$ input gradient (backward), and an odd last layer gathers its
    output, each rank's shard padded to $\\lceil w_L / N \\rceil$ columns.
    """
    head = []
    for j in range(len(widths) - 1):
        if j % 2:  # row-parallel
            head.append(("ring_allreduce", 4 * batch * widths[j + 1]))
        else:
            if j:  # column-parallel: dL/dX; the first one's is the features' reduce-scatter
                head.append(("ring_allreduce", 4 * batch * widths[j]))
            if j == len(widths) - 2:
                padded = -(-widths[j + 1] // world_size)
                head.append(("ring_allgather", 4 * world_size * batch * padded))
    return {
        "conv gradients": [("ring_allreduce", 4 * conv_params)],
        "features": [
            ("ring_allgather", 4 * batch * widths[0]),
            ("ring_reduce_scatter", 4 * batch * widths[0]),
        ],
        "labels": [("ring_allgather", 8 * batch)],  # int64
        "dense head": head,
    }


def hybrid_bytes(batch: int, world_size: int, conv_params: int, widths: list[int]) -> dict:
    """Return the bytes per rank (mean over ranks) of one hybrid step, per part.

    A ring allreduce of ``n`` bytes sends $2\\frac{N-1}{N} n$ per rank, a ring all-gather or
    reduce-scatter $\\frac{N-1}{N} n$: conv gradients $2f \\cdot 4P_{conv}$, features
    $2f \\cdot 4Bw_0$ (gathered forward, reduce-scattered backward), labels $f \\cdot 8B$, and
    the dense layers' activations (:func:`hybrid_collectives`), with $f = \\frac{N-1}{N}$.
    """
    f = (world_size - 1) / world_size
    share = {"ring_allreduce": 2 * f, "ring_allgather": f, "ring_reduce_scatter": f}
    parts = hybrid_collectives(batch, world_size, conv_params, widths)
    return {part: sum(share[alg] * n for alg, n in calls) for part, calls in parts.items()}


def crossover_batch(world_size: int, conv_params: int, widths: list[int]) -> float:
    """Return the batch size below which the hybrid sends fewer bytes per step than pure DP.

    Data parallelism's bytes are constant, the hybrid's grow linearly with the batch (features
    and dense activations travel, dense weights do not): they cross at
    $B^* = (DP - hybrid(0)) / (hybrid(1) - hybrid(0))$.
    """
    dp = data_parallel_bytes(conv_params + dense_params(widths), world_size)
    fixed = sum(hybrid_bytes(0, world_size, conv_params, widths).values())
    per_sample = sum(hybrid_bytes(1, world_size, conv_params, widths).values()) - fixed
    if world_size < 2 or per_sample <= 0:
        return float("inf")
    return (dp - fixed) / per_sample
