"""Lecture 9: Model (tensor) parallelism: one linear layer's neurons split over ranks (Megatron-LM style).

Source 001 calls it model parallelism: each layer's K neurons are split K/P per device, and
every device needs every device's outputs. For $Y = XW^T + b$ with $W$ of shape (out, in):

- **column-parallel** (split by output neurons): rank r holds rows ``out_r`` of $W$ and computes
  its own output columns $Y_r = X W_r^T + b_r$; gathering the $Y_r$ gives $Y$.
- **row-parallel** (split by input features): rank r holds columns ``in_r`` of $W$ and computes
  a partial sum $X_{:,in_r} W_{:,in_r}^T$; an allreduce of the partial sums (plus $b$ once) is $Y$.

A column-parallel layer that keeps its output split feeds a row-parallel layer directly (the
elementwise activation in between needs no communication), so a pair costs ONE allreduce in the
forward pass (Shoeybi et al. 2019, "Megatron-LM", section 3): the operator ``f`` before the pair
is the identity forward and an allreduce backward; ``g`` after it is an allreduce forward and the
identity backward. Shards are sized like ``chunk_bounds``: the first ``width % P`` ranks hold one
neuron more, so widths that do not divide by P work as long as every rank gets at least one.

The communicator is always an argument (no global process group): every rank of ``comm`` must run
the same layers on the same input, in the same order.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.comm.buffers import chunk_bounds
from course_lib.comm.communicator import Communicator

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelMLP",
    "copy_to_parallel",
    "gather_from_parallel",
    "reduce_from_parallel",
    "scatter_to_parallel",
    "shard_bounds",
]

_Layer = TypeVar("_Layer", bound="_ShardedLinear")


def shard_bounds(width: int, world_size: int, what: str = "layer width") -> list[tuple[int, int]]:
    """Return each rank's ``(start, stop)`` of ``width`` neurons; the first ``width % P`` get one more."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if width < world_size:
        raise ValueError(
            f"cannot split a {what} of {width} over {world_size} ranks: every rank needs at least "
            f"one neuron. Use at most {width} ranks (a sub-communicator, comm.subgroup(...)) or "
            f"a layer at least {world_size} wide."
        )
    return chunk_bounds(width, world_size)


# ---- the four communication operators, each an autograd.Function ------------------------------
class _CopyToParallel(torch.autograd.Function):
    """``f``: identity forward; backward sums the input gradient over ranks (every rank used X)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.comm.allreduce(grad.contiguous().clone()), None


class _ReduceFromParallel(torch.autograd.Function):
    """``g``: allreduce forward (sum the partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        return comm.allreduce(x.contiguous().clone())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _GatherFromParallel(torch.autograd.Function):
    """Gather every rank's last-dimension slice forward; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, bounds: list) -> torch.Tensor:
        a, b = bounds[comm.rank]
        ctx.a, ctx.b = a, b
        widest = max(stop - start for start, stop in bounds)
        # allgather needs equal sizes on every rank: pad the narrower shards, then cut the pad off
        padded = F.pad(x, (0, widest - (b - a))).contiguous()
        rows = comm.allgather(padded)  # (P, ..., widest)
        return torch.cat(
            [rows[r][..., : stop - start] for r, (start, stop) in enumerate(bounds)], -1
        )

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[..., ctx.a : ctx.b], None, None


class _ScatterToParallel(torch.autograd.Function):
    """Keep this rank's last-dimension slice forward; backward gathers the slices' gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, bounds: list) -> torch.Tensor:
        ctx.comm, ctx.bounds = comm, bounds
        a, b = bounds[comm.rank]
        return x[..., a:b].contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _GatherFromParallel.apply(grad, ctx.comm, ctx.bounds), None, None


def copy_to_parallel(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Return ``x`` unchanged; its gradient is allreduced over ``comm`` in the backward pass."""
    return _CopyToParallel.apply(x, comm)


def reduce_from_parallel(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Return the sum of ``x`` over every rank of ``comm``; the gradient passes through unchanged."""
    return _ReduceFromParallel.apply(x, comm)


def gather_from_parallel(x: torch.Tensor, comm: Communicator, bounds: list) -> torch.Tensor:
    """Concatenate every rank's slice ``x`` (widths from ``bounds``) along the last dimension."""
    return _GatherFromParallel.apply(x, comm, bounds)


def scatter_to_parallel(x: torch.Tensor, comm: Communicator, bounds: list) -> torch.Tensor:
    """Return this rank's slice ``bounds[rank]`` of ``x``'s last dimension; backward gathers."""
    return _ScatterToParallel.apply(x, comm, bounds)


# ---- the two layers ------------------------------------------------------------------------
class _ShardedLinear(nn.Module):
    """What both split layers share: :meth:`from_linear` copies this rank's shard of a full one."""

    def shard_of(self, linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return this rank's parts of ``linear``'s weight and bias (each split layer says which)."""
        raise NotImplementedError

    @classmethod
    def from_linear(cls: type[_Layer], linear: nn.Linear, comm: Communicator, **kw) -> _Layer:
        """Return this rank's shard of ``linear`` (same numbers as the full layer, copied)."""
        layer = cls(
            linear.in_features, linear.out_features, comm, bias=linear.bias is not None, **kw
        )
        weight, bias = layer.shard_of(linear)
        with torch.no_grad():
            layer.weight.copy_(weight)
            if layer.bias is not None:
                layer.bias.copy_(bias)
        return layer


class ColumnParallelLinear(_ShardedLinear):
    """A linear layer split by output neurons: this rank holds rows ``out_bounds[rank]`` of W.

    With ``gather_output=True`` the forward returns the full output on every rank (an allgather);
    with False it returns this rank's columns only, ready for a :class:`RowParallelLinear`.
    ``reduce_input_grad=False`` drops the allreduce of dL/dX (the operator ``f``) for a caller
    that sums it itself: Krizhevsky's hybrid (``course_lib.parallel.model_parallel.hybrid``) needs only its own
    rows of dL/dX and sums them with a reduce-scatter, half the bytes of the allreduce.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        comm: Communicator,
        gather_output: bool = True,
        bias: bool = True,
        reduce_input_grad: bool = True,
    ) -> None:
        super().__init__()
        self.comm, self.gather_output = comm, gather_output
        self.reduce_input_grad = reduce_input_grad
        self.in_features, self.out_features = in_features, out_features
        self.out_bounds = shard_bounds(out_features, comm.world_size, "column-parallel output")
        a, b = self.out_bounds[comm.rank]
        self.weight = nn.Parameter(torch.empty(b - a, in_features))
        self.bias = nn.Parameter(torch.zeros(b - a)) if bias else None

    def shard_of(self, linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return this rank's rows of ``linear``'s weight and bias."""
        a, b = self.out_bounds[self.comm.rank]
        return linear.weight[a:b], None if linear.bias is None else linear.bias[a:b]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # f: every rank uses all of X, so dL/dX is the sum of every rank's contribution
        x = copy_to_parallel(x, self.comm) if self.reduce_input_grad else x
        y = F.linear(x, self.weight, self.bias)
        return gather_from_parallel(y, self.comm, self.out_bounds) if self.gather_output else y


class RowParallelLinear(_ShardedLinear):
    """A linear layer split by input features: this rank holds columns ``in_bounds[rank]`` of W.

    With ``input_is_parallel=True`` the input is already this rank's slice of the features (the
    output of a :class:`ColumnParallelLinear` with ``gather_output=False``); otherwise the full
    input is sliced here. The bias is added once, after the partial sums are reduced.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        comm: Communicator,
        input_is_parallel: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.comm, self.input_is_parallel = comm, input_is_parallel
        self.in_features, self.out_features = in_features, out_features
        self.in_bounds = shard_bounds(in_features, comm.world_size, "row-parallel input")
        a, b = self.in_bounds[comm.rank]
        self.weight = nn.Parameter(torch.empty(out_features, b - a))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def shard_of(self, linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return this rank's columns of ``linear``'s weight, and its whole bias (added once)."""
        a, b = self.in_bounds[self.comm.rank]
        return linear.weight[:, a:b], linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_parallel(x, self.comm, self.in_bounds)
        y = reduce_from_parallel(F.linear(x, self.weight), self.comm)  # g: one allreduce
        return y + self.bias if self.bias is not None else y


class TensorParallelMLP(nn.Sequential):
    """An MLP (Flatten, Linear, ReLU, ..., Linear) with its Linear layers paired column -> row.

    Built from a full ``nn.Sequential`` such as ``course_lib.training.models.MLP``: the 1st, 3rd, ...
    Linear layers become column-parallel (output kept split), the 2nd, 4th, ... row-parallel,
    so each pair costs one allreduce forward; an odd last Linear is column-parallel, gathered.
    """

    def __init__(self, model: nn.Sequential, comm: Communicator) -> None:
        layers, pending_column = [], False
        linears = [m for m in model if isinstance(m, nn.Linear)]
        for module in model:
            if not isinstance(module, nn.Linear):
                layers.append(module)
            elif pending_column:
                layers.append(RowParallelLinear.from_linear(module, comm, input_is_parallel=True))
                pending_column = False
            else:
                last = module is linears[-1]
                layers.append(ColumnParallelLinear.from_linear(module, comm, gather_output=last))
                pending_column = not last
        super().__init__(*layers)
