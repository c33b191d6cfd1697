"""Lecture 11: Which memory technique a model and a room call for: the predicted bytes per worker of each.

For ``psi`` parameters trained with Adam on ``world_size`` workers of ``memory_bytes`` each, a
worker holds its model state (:func:`~course_lib.parallel.sharded.ledger.formula_bytes`, or
:func:`~course_lib.parallel.sharded.precision.mixed_precision_bytes`) plus the activations of
its share of the batch; recomputation divides the activations by about ``recompute_factor``.
Everything here is a *prediction* from those formulas (no framework's buffers, fragmentation or
communication buffers), to be compared with what the ledger measures.
"""

from __future__ import annotations

from course_lib.parallel.sharded.ledger import formula_bytes
from course_lib.parallel.sharded.precision import mixed_precision_bytes

__all__ = ["SCHEMES", "cheapest_fit", "predicted_bytes"]

#: Schemes in the order a room should try them: least communication and recomputation first.
SCHEMES = (
    ("DDP", 0, False),
    ("ZeRO-1", 1, False),
    ("ZeRO-2", 2, False),
    ("ZeRO-3 (FSDP)", 3, False),
    ("ZeRO-3 + recomputation", 3, True),
)


def predicted_bytes(
    stage: int,
    psi: float,
    world_size: int,
    activation_bytes: float,
    *,
    mixed: bool = False,
    recompute: bool = False,
    recompute_factor: float = 4.0,
) -> float:
    """Return the predicted peak bytes per worker: model state of ``stage`` plus activations."""
    state = (mixed_precision_bytes if mixed else formula_bytes)(stage, psi, world_size)
    return state + activation_bytes / (recompute_factor if recompute else 1.0)


def cheapest_fit(
    psi: float,
    world_size: int,
    activation_bytes: float,
    memory_bytes: float,
    *,
    mixed: bool = False,
) -> tuple[str, list[tuple[str, float]]]:
    """Return the first scheme of :data:`SCHEMES` that fits in ``memory_bytes``, and every prediction.

    The first scheme is ``"none: add workers, shrink the batch or the model"`` when nothing fits.
    """
    rows = [
        (name, predicted_bytes(stage, psi, world_size, activation_bytes, mixed=mixed, recompute=rc))
        for name, stage, rc in SCHEMES
    ]
    fits = [name for name, need in rows if need <= memory_bytes]
    return (fits[0] if fits else "none: add workers, shrink the batch or the model"), rows
