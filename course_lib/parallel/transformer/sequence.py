"""Lecture 14: sequence parallelism's two operators (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.2.2).

Tensor parallelism (lecture 9) leaves the LayerNorm and dropout regions of a block replicated:
every rank holds all $T$ tokens there. Sequence parallelism splits those regions along the
sequence, so each rank keeps $T/t$ tokens, and swaps the two Megatron operators:

- ``f`` (identity forward, allreduce backward) becomes $\\bar g$ = :func:`gather_sequence`:
  an allgather of the tokens forward, a reduce-scatter of their gradients backward;
- ``g`` (allreduce forward, identity backward) becomes $\\bar{g}'$ =
  :func:`reduce_scatter_sequence`: a reduce-scatter forward, an allgather backward.

An allreduce *is* a reduce-scatter followed by an allgather (a ring runs exactly those two
phases), so the bytes on a ring stay those of tensor parallelism while the activations of the
split regions are divided by $t$. Tensors are (batch, T, width); the sequence splits in equal
parts, so $T$ must divide by the number of ranks (Megatron requires the same).
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.comm.communicator import Communicator

__all__ = [
    "allreduce_grads",
    "gather_sequence",
    "reduce_scatter_sequence",
    "sequence_slice",
    "split_sequence",
]


def sequence_slice(length: int, comm: Communicator) -> slice:
    """Return this rank's positions ``[r T/t, (r+1) T/t)`` of a sequence of ``length`` tokens."""
    t = comm.world_size
    if length % t:
        raise ValueError(
            f"sequence parallelism splits T={length} tokens in {t} equal parts: choose a "
            f"context length that divides by {t}, or fewer ranks (a comm.subgroup)"
        )
    part = length // t
    return slice(comm.rank * part, (comm.rank + 1) * part)


def _allgather_seq(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    rows = comm.allgather(x.transpose(0, 1).contiguous())  # (t, T/t, batch, width)
    return torch.as_tensor(rows).flatten(0, 1).transpose(0, 1).contiguous()


def _reduce_scatter_seq(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    part = x.shape[1] // comm.world_size
    flat = x.transpose(0, 1).contiguous()  # (T, batch, width): rank r's tokens are one chunk
    mine = torch.as_tensor(comm.reduce_scatter(flat.view(-1)))
    return mine.view(part, *flat.shape[1:]).transpose(0, 1).contiguous()


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        ctx.comm = comm
        return _allgather_seq(x, comm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _reduce_scatter_seq(grad, ctx.comm), None


class _ReduceScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        ctx.comm = comm
        return _reduce_scatter_seq(x, comm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _allgather_seq(grad, ctx.comm), None


def gather_sequence(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Return every rank's tokens ``x`` (batch, T/t, width) side by side; backward reduce-scatters."""
    sequence_slice(x.shape[1] * comm.world_size, comm)
    return _GatherSequence.apply(x, comm)


def reduce_scatter_sequence(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Return this rank's tokens of the sum over ranks of ``x`` (batch, T, width); backward allgathers."""
    sequence_slice(x.shape[1], comm)
    return _ReduceScatterSequence.apply(x, comm)


def split_sequence(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Return this rank's tokens of ``x`` (batch, T, ...), no communication (the data is everywhere)."""
    return x[:, sequence_slice(x.shape[1], comm)]


def allreduce_grads(comm: Communicator, params: list[nn.Parameter]) -> None:
    """Sum the gradients of ``params`` over ranks in place, in one allreduce; every rank calls it.

    For weights that every rank holds whole but applied to its own tokens only (the LayerNorms
    under sequence parallelism, everything under context parallelism): each gradient is partial.
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return
    flat = torch.as_tensor(comm.allreduce(torch.cat([p.grad.reshape(-1) for p in params])))
    for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad.copy_(g.view_as(p))
