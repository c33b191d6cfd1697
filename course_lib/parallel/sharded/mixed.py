"""Lecture 11: ZeRO-3 in mixed precision as FSDP does it: 16-bit units on the wire and in compute, float32 master shards.

``Zero3(compute_dtype=torch.bfloat16, reduce_dtype=...)`` follows FSDP2's
``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` (Zhao et al. 2023, section 3.4):

* each rank's shard stays float32: it *is* the master copy Adam updates (m and v float32);
* before a module runs, its shard is cast to the compute dtype and allgathered in it: the
  gathered unit and the wire carry 2 bytes per value instead of 4;
* the model's inputs are cast to the compute dtype (FSDP2's ``cast_forward_inputs``), so
  forward and backward run in 16 bits and the gradients come out in 16 bits;
* each unit's gradients are cast to the reduce dtype and reduce-scattered in it (each partial
  sum rounded to it, as a 16-bit reduction on the wire is; bfloat16 is added in float32 and
  rounded to nearest even, as torch does); this rank's chunk of the mean becomes a float32
  gradient of the float32 shard.

Held between steps, per value and rank: shard 4 + gradient shard 4 + Adam's m, v 8 = 16/N.
That is the ZeRO paper's mixed-precision total, 2 + 2 + K = 12 (16-bit weights and gradients;
master weights, m and v in K), cut differently: FSDP keeps no 16-bit copy of the shard (it is
cast on the way to the wire) and no 16-bit gradient shard (cast to float32 once reduced). So
what 16 bits save at stage 3 is not the settled model state but the wire, the gathered unit
and its gradient (the in-flight peak), and the activations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["COMPUTE_DTYPES", "cast_inputs", "check_dtypes", "mixed_wire_bytes"]

#: The compute dtypes stage 3 accepts (float32: no mixed precision).
COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_dtypes(
    compute_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None
) -> tuple[torch.dtype, torch.dtype]:
    """Return (compute, reduce) dtypes; None: float32, and the reduce dtype defaults to the
    compute dtype, as FSDP2's ``reduce_dtype=None`` does. Raise ValueError naming the choices."""
    compute = compute_dtype or torch.float32
    reduce = reduce_dtype or compute
    for what, dtype in (("compute_dtype", compute), ("reduce_dtype", reduce)):
        if dtype not in COMPUTE_DTYPES:
            names = ", ".join(f"torch.{str(d).removeprefix('torch.')}" for d in COMPUTE_DTYPES)
            raise ValueError(f"{what}={dtype!r}: choose one of {names} (or None: float32)")
    return compute, reduce


def cast_inputs(dtype: torch.dtype) -> Any:
    """Return a forward pre-hook casting the model's floating-point inputs to ``dtype``."""

    def cast(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(
            a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args
        )

    return cast


def mixed_wire_bytes(
    psi: int, world_size: int, param_bytes: int, reduce_bytes: int, root_values: int = 0
) -> float:
    """Return the bytes each rank sends per step at stage 3: (N-1)/N ((2 Psi - Psi_root) p + Psi r).

    Two allgathers of the weights in the compute dtype (``param_bytes`` p per value; the root's
    unit once, see :mod:`.audit`) and one reduce-scatter in the reduce dtype (``reduce_bytes`` r).
    Float32 (p = r = 4): 12 (N-1)/N Psi; bfloat16 both ways: 6 (N-1)/N Psi.
    """
    n = world_size
    return (n - 1) / n * ((2 * psi - root_values) * param_bytes + psi * reduce_bytes)
