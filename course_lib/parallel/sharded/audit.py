"""Lecture 11: The bytes auditor: what each rank sent per step, against the formulas of each ZeRO stage.

One ring pass over a unit of ``M`` values (a reduce-scatter or an allgather) has rank ``r``
send every chunk but one: ``M - |chunk|`` values, where the reduce-scatter keeps chunk ``r``
and the allgather chunk ``r + 1`` (:func:`~course_lib.collectives.ring.ring_schedule`). Stages
0-2 make two passes per unit, 2(N-1)/N Psi values per rank; stage 3 three (the weights
gathered before forward and before backward, the gradients reduce-scattered),
3(N-1)/N Psi. With chunks of unequal length (``Psi`` not a multiple of ``N``) a rank's exact
count differs from the formula by less than one value per pass and unit.
"""

from __future__ import annotations

from typing import Any

from course_lib.comm.buffers import chunk_bounds

__all__ = ["audit_bytes", "exact_values_sent", "formula_values", "passes_per_step"]


def passes_per_step(stage: int) -> int:
    """Return how many ring passes each unit makes per step: 2 (stages 0-2) or 3 (stage 3)."""
    return 3 if stage == 3 else 2


def formula_values(stage: int, psi: int, world_size: int) -> float:
    """Return the values each rank sends per step: 2(N-1)/N Psi, or 3(N-1)/N Psi at stage 3."""
    return passes_per_step(stage) * (world_size - 1) / world_size * psi


def exact_values_sent(stage: int, units: list[int], rank: int, world_size: int) -> int:
    """Return the values rank ``rank`` sends per step for units of ``units`` values each."""
    n, total = world_size, 0
    if n == 1:
        return 0
    for m in units:
        size = [b - a for a, b in chunk_bounds(m, n)]
        reduce_scatter, allgather = m - size[rank], m - size[(rank + 1) % n]
        total += reduce_scatter + allgather * (passes_per_step(stage) - 1)
    return total


def audit_bytes(
    records: list[dict[str, Any]], stage: int, units: list[int], world_size: int, itemsize: int = 4
) -> list[dict[str, Any]]:
    """Return one row per rank and step: bytes sent (the counters), exact and formula bytes.

    ``ok`` is True when the counters equal the exact count and that is within one value per
    pass and unit of the formula. ``records``: a data-parallel result's step records.
    """
    psi = sum(units)
    slack = itemsize * passes_per_step(stage) * len(units)
    rows = []
    for rec in records:
        exact = itemsize * exact_values_sent(stage, units, rec["rank"], world_size)
        formula = itemsize * formula_values(stage, psi, world_size)
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
