"""Lecture 15: A process grid: ranks laid out on named axes, one sub-communicator per axis line.

``N = d_0 x d_1 x ...`` ranks are numbered row-major over named axes (e.g. data x expert, or
data x tensor x pipeline): rank ``r`` has coordinates ``np.unravel_index(r, dims)``. Along each
axis the ranks that differ only in that coordinate form a line; every line is a
sub-communicator, and a rank's communicator for an axis is the line it lies on. This is what
PyTorch's ``DeviceMesh`` is (``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))``,
``mesh["dp"]`` a process group): a grid of subgroups, each collective of a parallelism run on
the axis it belongs to. The last axis is the innermost, so its ranks are neighbours: put the
axis that talks most (tensor parallelism) there, where a real machine has its fastest links.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ProcessGrid", "grid_lines", "grid_shape"]


def grid_lines(dims: tuple[int, ...], axis: int) -> list[list[int]]:
    """Return every line of ranks along ``axis`` of a row-major grid of shape ``dims``."""
    ranks = np.arange(math.prod(dims)).reshape(dims)
    moved = np.moveaxis(ranks, axis, -1).reshape(-1, dims[axis])
    return [list(map(int, line)) for line in moved]


def grid_shape(axes: dict[str, int], world_size: int) -> tuple[int, ...]:
    """Return the grid's sizes after checking that they fill ``world_size`` ranks exactly."""
    dims = tuple(int(v) for v in axes.values())
    if min(dims, default=0) < 1 or math.prod(dims) != world_size:
        shape = " x ".join(f"{k}={v}" for k, v in axes.items())
        raise ValueError(
            f"a grid {shape} has {math.prod(dims)} places but the communicator has "
            f"{world_size} ranks: choose sizes >= 1 whose product is {world_size}"
        )
    return dims


class ProcessGrid:
    """This rank's place in a grid over ``comm`` and its sub-communicator along each named axis.

    Every rank of ``comm`` must create it with the same ``axes`` (each line's subgroup is made
    by every rank, in the same order).
    """

    def __init__(self, comm: Any, axes: dict[str, int]) -> None:
        dims = grid_shape(axes, comm.world_size)
        self.comm, self.names, self.dims = comm, list(axes), dims
        self.coords = dict(
            zip(self.names, map(int, np.unravel_index(comm.rank, dims)), strict=True)
        )
        self.comms: dict[str, Any] = {}
        for axis, name in enumerate(self.names):
            for line in grid_lines(dims, axis):
                sub = comm.subgroup(line)  # collective: every rank makes every line
                if sub is not None:
                    self.comms[name] = sub

    def __getitem__(self, name: str) -> Any:
        """Return this rank's sub-communicator along axis ``name`` (as ``mesh["dp"]``)."""
        if name not in self.comms:
            raise KeyError(f"no axis {name!r}; this grid has {self.names}")
        return self.comms[name]

    def __repr__(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in self.coords.items())
        shape = " x ".join(f"{k} {v}" for k, v in zip(self.names, self.dims, strict=True))
        return f"<ProcessGrid {shape}: rank {self.comm.rank} at {where}>"
