"""Lecture 15: which (dp, tp, pp, cp) grid a model and a room call for: memory first, then time.

For every grid of the room's ranks the model can be cut into (stages <= blocks, the batch and
the sequence divisible), the simulator (:mod:`course_lib.parallel.grid.simulate3d`) predicts a
step and each rank's activations; then the one decision procedure of lectures 11 and 13,
:func:`course_lib.parallel.sharded.technique.choose_technique`, decides on memory alone which
rung the data axis needs (DDP, ZeRO-1/2/3, recomputation) with the model-parallel shard as
the model (its parameters per rank) and the data x context replicas as the workers. A grid
whose shard fits no rung is out; among the rest the fastest predicted step wins (ZeRO-3's
extra half of the data axis's bytes is simulated). A prediction, not a measurement.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from course_lib.cost_model.messages import Network
from course_lib.parallel.grid.costs3d import PieceCosts
from course_lib.parallel.grid.equality3d import grid_params
from course_lib.parallel.grid.simulate3d import Grid, predict_grid
from course_lib.parallel.sharded.technique import choose_technique

__all__ = ["GridRow", "candidate_grids", "search_grids"]


@dataclass(frozen=True)
class GridRow:
    """One grid's prediction: the technique its data axis needs, its peak per rank, its step."""

    grid: Grid
    technique: str
    fits: bool
    peak_bytes: float
    step_seconds: float


def candidate_grids(
    world_size: int, sizes: dict, batch: int, length: int, num_microbatches: int
) -> list[Grid]:
    """Return every (dp, tp, pp, cp) filling ``world_size`` that this model and batch allow."""
    out = []
    divisors = [k for k in range(1, world_size + 1) if world_size % k == 0]
    for dp, tp, pp in itertools.product(divisors, repeat=3):
        cp, rest = divmod(world_size, dp * tp * pp)
        if rest or cp < 1 or dp * tp * pp * cp != world_size:
            continue
        ok = (
            pp <= sizes["n_layer"]
            and tp <= sizes["n_head"]
            and batch % (dp * num_microbatches) == 0
            and length % cp == 0
        )
        if ok:
            out.append(Grid(dp, tp, pp, cp))
    return out


def search_grids(
    world_size: int,
    sizes: dict,
    batch: int,
    length: int,
    num_microbatches: int,
    memory_bytes: float,
    link: Network,
    costs_for: Callable[[Grid], PieceCosts],
) -> tuple[list[GridRow], GridRow | None]:
    """Return every candidate grid's row, fastest first, and the fastest that fits (None if none).

    ``costs_for(grid)``: the pieces' costs at that grid's shapes (measured, or a model of them).
    """
    rows = []
    for grid in candidate_grids(world_size, sizes, batch, length, num_microbatches):
        costs = costs_for(grid)
        sim = predict_grid(grid, sizes, batch, length, num_microbatches, costs, link)
        dims = {"data": grid.dp, "pipeline": grid.pp, "tensor": grid.tp}
        shards = [
            grid_params(sizes, dims, {"pipeline": s, "tensor": t})
            for s in range(grid.pp)
            for t in range(grid.tp)
        ]
        peaks = sim.peak_memory()
        activations = max(peaks[w] - sim.state_bytes[w] for w in peaks)
        layers = max(1, sizes["n_layer"] // grid.pp)
        choice = choose_technique(
            max(shards), grid.dp * grid.cp, memory_bytes, activations,
            layers=layers, largest_unit=max(shards) / layers,
        )  # fmt: skip
        if choice.technique.startswith("ZeRO-3"):  # the weights gathered too: 1.5x the bytes
            sim = predict_grid(grid, sizes, batch, length, num_microbatches, costs, link, 1.5)
        peak = next((need for name, need, _ in choice.rows if name == choice.technique), 0.0)
        if not choice.fits:
            peak = min(need for _, need, _ in choice.rows)
        rows.append(GridRow(grid, choice.technique, choice.fits, peak, sim.step_time))
    rows.sort(key=lambda r: (not r.fits, r.step_seconds))
    best = rows[0] if rows and rows[0].fits else None
    return rows, best
