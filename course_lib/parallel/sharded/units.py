"""Lecture 11: The flat units of sharded data parallelism: which parameters travel together, and each rank's shard.

A *unit* is a group of trainable parameters stored back to back in one flat float32 buffer
(each parameter becomes a view of its slice, as FSDP's flat parameter). The buffer is cut into
``N`` chunks with the ring's layout (:func:`~course_lib.comm.buffers.chunk_bounds`: the first
``numel % N`` chunks one longer), so chunk ``r`` is what the ring's reduce-scatter leaves
complete on rank ``r``: rank ``r``'s *shard* of the unit. Stage 1 has one unit (the whole
model), stage 2 one per gradient bucket, stage 3 one per module (the FSDP unit); with
``min_unit`` (FSDP's size-based wrapping policy, ``min_num_params``) a module with fewer values
of its own is no unit: its parameters join the root's unit, gathered once per step.

Frozen parameters belong to no unit (they are neither sent nor updated); a tied parameter
(one ``nn.Parameter`` registered twice) belongs to one unit, once.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from course_lib.comm.buffers import chunk_bounds

__all__ = ["FlatUnit", "plan_units", "root_unit", "unit_sizes"]


class FlatUnit:
    """Parameters stored in one flat buffer; ``bounds[r]`` is rank ``r``'s chunk of it."""

    def __init__(
        self, index: int, params: list[nn.Parameter], names: list[str], world_size: int, label: str
    ) -> None:
        self.index, self.params, self.names, self.label = index, params, names, label
        self.numel = sum(p.numel() for p in params)
        self.bounds = chunk_bounds(self.numel, world_size)
        self.flat = torch.zeros(0)
        self.gathered = True  # the flat buffer holds every chunk
        self.ready = 0  # parameters whose gradient this backward has produced
        self.reduced = False  # this step's gradients were reduce-scattered

    def chunk(self, rank: int) -> slice:
        """Return rank ``rank``'s slice of the flat buffer."""
        a, b = self.bounds[rank]
        return slice(a, b)

    def flatten_parameters(self) -> None:
        """Copy the parameters into one new flat buffer and make each a view of its slice."""
        with torch.no_grad():
            self.flat = torch.cat([p.detach().reshape(-1).float() for p in self.params])
            offset = 0
            for p in self.params:
                p.data = self.flat[offset : offset + p.numel()].view(p.shape)
                offset += p.numel()

    def set_dtype(self, dtype: torch.dtype) -> None:
        """Give the unit a new flat buffer of ``dtype`` (values undefined) and make each
        parameter a view of its slice (stage 3 in mixed precision: the gathered 16-bit unit)."""
        self.flat = torch.empty(self.numel, dtype=dtype)
        offset = 0
        for p in self.params:
            p.data = self.flat[offset : offset + p.numel()].view(p.shape)
            offset += p.numel()
        self.gathered = True

    def flat_numpy(self) -> np.ndarray:
        """Return a NumPy view of the flat buffer (take a new one after every resize)."""
        return self.flat.detach().numpy()

    def free(self) -> None:
        """Release the flat buffer's memory; the parameters keep their shapes, not their values."""
        self.flat.untyped_storage().resize_(0)
        self.gathered = False

    def allocate(self) -> None:
        """Give the flat buffer its memory back (values undefined until gathered)."""
        self.flat.untyped_storage().resize_(self.numel * self.flat.element_size())

    def flat_grads(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Return the unit's gradients in one new flat buffer of ``dtype`` (zeros where None)."""
        return torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(dtype)
                for p in self.params
            ]
        )


def _check(units: list[FlatUnit], world_size: int, stage: int) -> None:
    """Raise ValueError naming the fix when some rank would hold no part of a unit."""
    total = sum(u.numel for u in units)
    if total < world_size:
        raise ValueError(
            f"the model has {total} trainable values, fewer than world_size={world_size}: some "
            f"ranks would hold no shard; use world_size <= {total} or a larger model"
        )
    for u in units:
        if u.numel < world_size:
            fix = "give it more values or freeze it" if stage == 3 else "use a larger bucket_bytes"
            raise ValueError(
                f"unit {u.label} has {u.numel} values, fewer than world_size={world_size}: a rank "
                f"would hold an empty shard of it; {fix}, or train on at most {u.numel} ranks"
            )


def plan_units(
    net: nn.Module, stage: int, world_size: int, bucket_bytes: int = 1 << 16, min_unit: int = 0
) -> list[FlatUnit]:
    """Return the units of ``stage`` for ``net`` on ``world_size`` ranks (not yet flattened).

    Stages 0-1: one unit of every trainable parameter in registration order. Stage 2: buckets
    of about ``bucket_bytes`` in *reverse* order (backward produces the last layer's gradients
    first, so the first bucket is ready first). Stage 3: one unit per module that registers
    trainable parameters itself, in registration order (a tied parameter with its first module);
    the parameters ``net`` registers itself and those of every module with fewer than
    ``min_unit`` values of its own make one root unit, first (:func:`root_unit`).
    """
    named = {id(p): n for n, p in net.named_parameters() if p.requires_grad}  # first name of each
    params = [p for p in net.parameters() if p.requires_grad]
    groups: list[tuple[str, list[nn.Parameter]]] = []
    if stage in (0, 1):
        groups = [("model", params)]
    elif stage == 2:
        current: list[nn.Parameter] = []
        for p in reversed(params):
            current.append(p)
            if sum(q.numel() for q in current) * 4 >= bucket_bytes:
                groups.append((f"bucket {len(groups)}", current))
                current = []
        if current:
            groups.append((f"bucket {len(groups)}", current))
    elif stage == 3:
        root, groups = _stage3_groups(net, min_unit)
        if root:
            small = f" with the modules under {min_unit} values" if min_unit else ""
            groups.insert(0, (f"module {type(net).__name__!r}{small}", root))
    else:
        raise ValueError(f"stage={stage!r}: ZeRO has stages 0 (plain DDP), 1, 2 and 3")
    units = [
        FlatUnit(k, ps, [named[id(p)] for p in ps], world_size, label)
        for k, (label, ps) in enumerate(groups)
    ]
    _check(units, world_size, stage)
    return units


def unit_sizes(
    net: nn.Module, stage: int, world_size: int, bucket_bytes: int = 1 << 16, min_unit: int = 0
) -> list[int]:
    """Return the number of values in each unit :func:`plan_units` makes (for the bytes auditor)."""
    return [u.numel for u in plan_units(net, stage, world_size, bucket_bytes, min_unit)]


def _stage3_groups(
    net: nn.Module, min_unit: int
) -> tuple[list[nn.Parameter], list[tuple[str, list[nn.Parameter]]]]:
    """Return stage 3's root parameters and the other modules' (label, parameters) groups."""
    seen: set[int] = set()
    root: list[nn.Parameter] = []
    groups: list[tuple[str, list[nn.Parameter]]] = []
    for mname, module in net.named_modules():
        mine = [
            p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in seen
        ]
        seen.update(id(p) for p in mine)
        if module is not net and sum(p.numel() for p in mine) >= max(min_unit, 1):
            groups.append((f"module {mname!r}", mine))
        else:  # the root's own, or too small to travel alone: the root's unit
            root += mine
    return root, groups


def root_unit(net: nn.Module, stage: int, min_unit: int = 0) -> bool:
    """Return True when stage ``stage``'s first unit is the root's: the parameters ``net``
    registers itself and (``min_unit``) those of its modules with fewer values of their own.

    At stage 3 that unit is gathered once per step (the bytes auditor's ``root``).
    """
    return stage == 3 and bool(_stage3_groups(net, min_unit)[0])
