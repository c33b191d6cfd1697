"""Lecture 15: a whole TinyGPT block under PyTorch's tensor- and sequence-parallel plans, beside the kit's.

PyTorch's tutorial recipe (``torch.distributed.tensor.parallel``): ``ColwiseParallel`` on the
query, key and value projections and the MLP's first layer, ``RowwiseParallel`` on the
attention's output projection and the MLP's second layer; for sequence parallelism
(Korthikanti et al. 2022) ``SequenceParallel`` on both LayerNorms, the column layers fed a
sequence-sharded input (``input_layouts=Shard(1)``: an allgather) and the row layers handing one
back (``output_layouts=Shard(1)``: a reduce-scatter). TinyGPT's attention projects q, k, v in
one ``Linear``, whose columns DTensor would cut across the three; the plan needs them apart, so
the block is rebuilt with three projections holding the same weights, and its attention counts
heads from the local width (``-1``), as the tutorial's ``n_heads // tp``.
:func:`compare_block` runs that and lecture 14's :class:`~course_lib.parallel.transformer.heads.ParallelBlock`
(``f`` / ``g``, or the sequence's gather / reduce-scatter) from one full block on every rank.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.training.transformer import Block

__all__ = ["SplitBlock", "compare_block"]


class _SplitAttention(nn.Module):
    """Causal attention with separate q, k, v projections; heads counted from the local width."""

    def __init__(self, qkv: nn.Linear, out: nn.Linear, n_head: int) -> None:
        super().__init__()
        d = out.in_features
        self.head_dim = d // n_head
        self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
        with torch.no_grad():
            for i, lin in enumerate((self.q, self.k, self.v)):
                lin.weight.copy_(qkv.weight[i * d : (i + 1) * d])
                lin.bias.copy_(qkv.bias[i * d : (i + 1) * d])
        self.out = copy.deepcopy(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, _ = x.shape
        heads = [
            z(x).view(n, t, -1, self.head_dim).transpose(1, 2) for z in (self.q, self.k, self.v)
        ]
        y = F.scaled_dot_product_attention(*heads, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(n, t, -1))


class SplitBlock(nn.Module):
    """TinyGPT's ``Block`` with q, k, v apart (same weights), ready for DTensor's plans."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.norm1, self.norm2 = copy.deepcopy(block.norm1), copy.deepcopy(block.norm2)
        self.attn = _SplitAttention(block.attn.qkv, block.attn.out, block.attn.n_head)
        self.mlp = copy.deepcopy(block.mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _plan(sequence_parallel: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        col = {f"attn.{n}": ColwiseParallel() for n in "qkv"}
        return {**col, "attn.out": RowwiseParallel(), "mlp.0": ColwiseParallel(),
                "mlp.2": RowwiseParallel()}  # fmt: skip
    return {
        "norm1": SequenceParallel(),
        # one allgather of the sequence for q, k and v together, as the kit's gather does
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        **{f"attn.{n}": ColwiseParallel() for n in "qkv"},
        "attn.out": RowwiseParallel(output_layouts=Shard(1)),
        "norm2": SequenceParallel(),
        "mlp.0": ColwiseParallel(input_layouts=Shard(1)),
        "mlp.2": RowwiseParallel(output_layouts=Shard(1)),
    }


def _local(t: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def compare_block(
    comm: Any, sequence_parallel: bool = False, d_model: int = 16, n_head: int = 4,
    length: int = 8, batch: int = 3,
) -> dict[str, float]:  # fmt: skip
    """Run one TinyGPT block under DTensor's plans and as the kit's; return the largest differences.

    Every rank of the gloo world calls it (the kit's communicator spans the default group);
    ``n_head``, ``4 d_model`` and ``length`` divide by the ranks (DTensor cuts as ``torch.chunk``).
    Compared on this rank: the output (its sequence share under sequence parallelism), the
    input's gradient, every sharded weight's gradient shard, and the LayerNorms' gradients,
    each relative to the kit's largest value.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from course_lib.parallel.model_parallel.tensor_parallel import (
        copy_to_parallel,
        reduce_from_parallel,
    )
    from course_lib.parallel.transformer.heads import ParallelBlock
    from course_lib.parallel.transformer.sequence import (
        allreduce_grads,
        gather_sequence,
        reduce_scatter_sequence,
    )

    p = comm.world_size
    if n_head % p or length % p:
        raise ValueError(f"n_head={n_head} and length={length} must divide by {p} ranks")
    torch.manual_seed(0)  # the same full block and input on every rank
    full = Block(d_model, n_head)
    X = torch.randn(batch, length, d_model)
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("tp",))
    dt = parallelize_module(SplitBlock(full), mesh, _plan(sequence_parallel))
    kit = ParallelBlock(d_model, n_head, comm)
    state = full.state_dict()
    with torch.no_grad():
        for name, q in kit.named_parameters():
            q.copy_(kit.shard_of(name, state))
    if sequence_parallel:
        share = slice(comm.rank * length // p, (comm.rank + 1) * length // p)
        X = X[:, share]
        enter = lambda z: gather_sequence(z, comm)  # noqa: E731
        leave = lambda z: reduce_scatter_sequence(z, comm)  # noqa: E731
    else:
        enter = lambda z: copy_to_parallel(z, comm)  # noqa: E731
        leave = lambda z: reduce_from_parallel(z, comm)  # noqa: E731
    X_dt, X_kit = X.clone().requires_grad_(), X.clone().requires_grad_()
    y_dt, y_kit = _local_out(dt(X_dt)), kit(X_kit, enter, leave)
    (y_dt**2).sum().backward()
    (y_kit**2).sum().backward()
    if sequence_parallel:  # the replicated weights saw only this rank's tokens: sum them
        allreduce_grads(comm, [kit.norm1.weight, kit.norm1.bias, kit.norm2.weight,
                               kit.norm2.bias, kit.attn.out_bias, kit.fc2_bias])  # fmt: skip
    grad = lambda m: m.weight.grad.to_local()  # noqa: E731 - this rank's shard, as DTensor cut it
    qkv = torch.cat([grad(getattr(dt.attn, n)) for n in "qkv"])
    pairs = {
        "output": (y_dt, y_kit),
        "input grad": (X_dt.grad, X_kit.grad),
        "qkv weight grad": (qkv, kit.attn.qkv_weight.grad),
        "attention output weight grad": (grad(dt.attn.out), kit.attn.out_weight.grad),
        "mlp weight grads": (torch.cat([grad(dt.mlp[0]).T, grad(dt.mlp[2])]),
                             torch.cat([kit.fc1_weight.grad.T, kit.fc2_weight.grad])),
        "layernorm grads": (torch.cat([_local(n.weight.grad) for n in (dt.norm1, dt.norm2)]),
                            torch.cat([kit.norm1.weight.grad, kit.norm2.weight.grad])),
    }  # fmt: skip
    return {
        k: float((a - b).detach().abs().max() / b.detach().abs().max())
        for k, (a, b) in pairs.items()
    }


def _local_out(y: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return y.to_local() if isinstance(y, DTensor) else y
