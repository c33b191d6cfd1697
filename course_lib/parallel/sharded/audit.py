"""Lecture 11: The bytes auditor: what each rank sent per step, against the formulas of each ZeRO stage.

One ring pass over a unit of ``M`` values (a reduce-scatter or an allgather) has rank ``r``
send every chunk but one: ``M - |chunk|`` values, where the reduce-scatter keeps chunk ``r``
and the allgather chunk ``r + 1`` (:func:`~course_lib.collectives.ring.ring_schedule`). Stages
0-2 make two passes per unit, 2(N-1)/N Psi values per rank; stage 3 three (the weights
gathered before forward and before backward, the gradients reduce-scattered),
3(N-1)/N Psi, except for the root module's own unit (the parameters the model registers
itself): it stays gathered from its forward to its backward, as FSDP2 keeps its root's
(``reshard_after_forward`` is False for the root), so it makes two passes. With a root unit of
``Psi_root`` values stage 3 sends (N-1)/N (3 Psi - Psi_root). ``Zero3(keep_last=True)`` keeps
one more unit gathered from its forward into its backward: in the steps whose record says so
(``zero3_kept_values``) it makes two passes too, and its values count in ``Psi_root``. With
chunks of unequal length (``Psi`` not a multiple of ``N``) a rank's exact count differs from the
formula by less than one value per pass and unit. Stage 3 in mixed precision (:mod:`.mixed`) gathers in the compute
dtype and reduce-scatters in the reduce dtype: ``itemsize`` and ``reduce_itemsize`` bytes a value.
"""

from __future__ import annotations

from typing import Any

from course_lib.comm.buffers import chunk_bounds
from course_lib.parallel.sharded.mixed import mixed_wire_bytes

__all__ = [
    "audit_bytes",
    "exact_bytes_sent",
    "exact_values_sent",
    "formula_values",
    "passes_per_step",
]


def passes_per_step(stage: int, root: bool = False) -> int:
    """Return the ring passes a unit makes per step: 2 (stages 0-2, stage 3's root unit) or 3."""
    return 3 if stage == 3 and not root else 2


def formula_values(stage: int, psi: int, world_size: int, root_values: int = 0) -> float:
    """Return the values each rank sends per step: 2(N-1)/N Psi, or (N-1)/N (3 Psi - Psi_root) at stage 3.

    ``root_values``: the values in the root module's own unit (stage 3 gathers them once).
    """
    n = world_size
    if stage != 3:
        return 2 * (n - 1) / n * psi
    return (n - 1) / n * (3 * psi - root_values)


def exact_values_sent(
    stage: int, units: list[int], rank: int, world_size: int, root: bool = False
) -> int:
    """Return the values rank ``rank`` sends per step for units of ``units`` values each.

    ``root``: ``units[0]`` is the root module's own unit (at stage 3 it travels twice, not three times).
    """
    return exact_bytes_sent(stage, units, rank, world_size, root, 1, 1)


def exact_bytes_sent(
    stage: int,
    units: list[int],
    rank: int,
    world_size: int,
    root: bool = False,
    itemsize: int = 4,
    reduce_itemsize: int | None = None,
    kept: int | None = None,
) -> int:
    """Return the bytes rank ``rank`` sends per step: allgathers at ``itemsize`` bytes a value,
    reduce-scatters at ``reduce_itemsize`` (default: the same); unit ``kept`` (if any) stayed
    gathered from forward to backward, as the root's does."""
    n, total, r_size = world_size, 0, reduce_itemsize or itemsize
    if n == 1:
        return 0
    for k, m in enumerate(units):
        size = [b - a for a, b in chunk_bounds(m, n)]
        reduce_scatter, allgather = m - size[rank], m - size[(rank + 1) % n]
        gathers = passes_per_step(stage, (root and k == 0) or k == kept) - 1
        total += reduce_scatter * r_size + allgather * gathers * itemsize
    return total


def audit_bytes(
    records: list[dict[str, Any]],
    stage: int,
    units: list[int],
    world_size: int,
    itemsize: int = 4,
    root: bool = False,
    reduce_itemsize: int | None = None,
    kept: int | None = None,
) -> list[dict[str, Any]]:
    """Return one row per rank and step: bytes sent (the counters), exact and formula bytes.

    ``ok`` is True when the counters equal the exact count and that is within one value per
    pass and unit of the formula. ``records``: a data-parallel result's step records;
    ``root``: ``units[0]`` is the root module's own unit (:func:`~.units.root_unit`);
    ``itemsize``/``reduce_itemsize``: bytes a value in the allgathers / reduce-scatters;
    ``kept``: the unit ``Zero3(keep_last=True)`` keeps, counted twice where a record says so.
    """
    psi, r_size = sum(units), reduce_itemsize or itemsize
    slack = max(itemsize, r_size) * passes_per_step(stage) * len(units)
    root_values = units[0] if root and units else 0
    rows = []
    for rec in records:
        held = rec.get("zero3_kept_values", 0)
        if held and (kept is None or units[kept] != held):
            raise ValueError(
                f"step {rec['step']} kept {held} values gathered into backward: pass kept=, the "
                "index of that unit in units"
            )
        here = kept if held else None
        exact = exact_bytes_sent(
            stage, units, rec["rank"], world_size, root, itemsize, r_size, here
        )
        twice = root_values + held
        if stage == 3:
            formula = mixed_wire_bytes(psi, world_size, itemsize, r_size, twice)
        else:
            formula = itemsize * formula_values(stage, psi, world_size, twice)
        rows.append(
            {
                "rank": rec["rank"],
                "step": rec["step"],
                "sent": rec["bytes_sent"],
                "exact": exact,
                "formula": formula,
                "ok": rec["bytes_sent"] == exact and abs(exact - formula) < slack,
            }
        )
    return rows
