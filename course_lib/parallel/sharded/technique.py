"""Lectures 11 and 13: Which memory technique a model and a room call for: the one decision procedure.

Fit in memory first, counting Adam's state; then take the least communication that fits. The
rungs, in the order the Ultra-Scale Playbook (Tazi et al. 2025, "Step 1: fitting a training step
in memory") and the ZeRO paper (Rajbhandari et al. 2020) try them:

1. DDP: every worker holds the whole model state (16 bytes per parameter with Adam).
2. ZeRO-1, then ZeRO-2: the optimiser state, then the gradients, cut in shards; the same bytes
   on the wire as DDP.
3. ZeRO-3 / FSDP: the weights too; half as many bytes again on the wire, and at the peak the
   largest unit is gathered whole (its weights and its gradient) on top of the shards.
4. + recomputation (Chen et al. 2016): keep about 2/sqrt(L) of the activations of L layers
   (a checkpoint every sqrt(L) layers, one segment recomputed at a time), one more forward.
5. + tensor parallelism of degree t among workers on a fast link (Shoeybi et al. 2019 with
   sequence parallelism, Korthikanti et al. 2022): activations and each unit cut t ways, one
   allreduce per layer in forward and backward; the first rung that splits what ZeRO cannot.

This decides on *memory alone*: a rung that fits can still be too slow for the room's link
(``Choice.rows`` carries each rung's bytes sent per step so the time can be predicted beside
it). Model state per worker: :func:`~.ledger.formula_bytes` for float32 and for ``autocast``
(its weights and gradients stay float32: 4 + 4 + 8 bytes), :func:`~.precision.mixed_precision_bytes`
for the ZeRO paper's scheme (16-bit weights and gradients, float32 master and moments: 2 + 2 + 12).
Activations are an input (measured, or from a formula in the batch, sequence, width and depth):
they do not scale with the parameter count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_lib.parallel.sharded.audit import formula_values
from course_lib.parallel.sharded.ledger import formula_bytes
from course_lib.parallel.sharded.precision import mixed_precision_bytes

__all__ = ["LADDER", "PRECISIONS", "Choice", "Rung", "choose_technique", "rung_bytes"]

#: Model-state schemes: float32 Adam, autocast (float32 weights and gradients), the ZeRO paper's mixed.
PRECISIONS = ("float32", "autocast", "mixed")


@dataclass(frozen=True)
class Rung:
    """One technique of the ladder: a ZeRO stage, with or without recomputation and tensor parallelism."""

    name: str
    stage: int
    recompute: bool = False
    tensor_parallel: bool = False


#: The rungs in the order a room tries them: least communication and recomputation first.
LADDER = (
    Rung("DDP", 0),
    Rung("ZeRO-1", 1),
    Rung("ZeRO-2", 2),
    Rung("ZeRO-3 (FSDP)", 3),
    Rung("ZeRO-3 + recomputation", 3, recompute=True),
    Rung("ZeRO-3 + recomputation + tensor parallelism", 3, recompute=True, tensor_parallel=True),
)


@dataclass(frozen=True)
class Choice:
    """The first rung that fits (``technique``), every rung's predicted peak and bytes sent per step."""

    technique: str
    rows: tuple[tuple[str, float, float], ...]  # (rung, peak bytes per worker, bytes sent per step)
    memory_bytes: float

    @property
    def fits(self) -> bool:
        """True when some rung fits."""
        return not self.technique.startswith("none")

    def sentence(self) -> str:
        """Return the decision in one line, with the peak it predicts against the memory."""
        if not self.fits:
            least = min(self.rows, key=lambda r: r[1])
            return (
                f"nothing fits in {self.memory_bytes / 1e9:.3g} GB per worker (the least, {least[0]}, "
                f"needs {least[1] / 1e9:.3g} GB): add workers, or shrink the batch or the model"
            )
        need = next(r[1] for r in self.rows if r[0] == self.technique)
        return (
            f"{self.technique}: the first rung that fits ({need / 1e9:.3g} of "
            f"{self.memory_bytes / 1e9:.3g} GB per worker, PREDICTED)"
        )


def _state_bytes(precision: str, stage: int, psi: float, world_size: int) -> float:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "mixed":
        return mixed_precision_bytes(stage, psi, world_size)
    return formula_bytes(stage, psi, world_size)


def rung_bytes(
    rung: Rung,
    psi: float,
    world_size: int,
    activation_bytes: float,
    *,
    layers: int = 1,
    largest_unit: float = 0.0,
    precision: str = "float32",
    tensor_parallel: int = 1,
) -> float:
    """Return the predicted peak bytes per worker of ``rung``: model state + gathered unit + activations.

    ``activation_bytes``: one worker's activations for its share of the batch (measured or from
    a formula); ``layers``: how many layers they span (recomputation keeps 2/sqrt(layers) of
    them, Chen et al. 2016); ``largest_unit``: the parameters of the largest FSDP unit (stage 3
    gathers it whole, weights and gradient); ``tensor_parallel``: the degree t of the last rung.
    """
    state = _state_bytes(precision, rung.stage, psi, world_size)
    weight_bytes = 2 if precision == "mixed" else 4
    t = tensor_parallel if rung.tensor_parallel else 1
    gathered = 2 * weight_bytes * largest_unit / t if rung.stage == 3 else 0.0
    kept = min(1.0, 2 / math.sqrt(layers)) if rung.recompute else 1.0
    return state + gathered + activation_bytes * kept / t


def choose_technique(
    psi: float,
    world_size: int,
    memory_bytes: float,
    activation_bytes: float,
    *,
    layers: int = 1,
    largest_unit: float = 0.0,
    precision: str = "float32",
    tensor_parallel: int = 1,
) -> Choice:
    """Return the first rung of :data:`LADDER` whose predicted peak fits in ``memory_bytes``.

    Model state counts Adam's moments (16 bytes per parameter before sharding). The last rung
    is tried only when ``tensor_parallel`` > 1 (workers sharing a fast link). Memory only: see
    each row's bytes sent per step for what the link will cost.
    """
    if world_size < 1 or memory_bytes <= 0 or activation_bytes < 0 or layers < 1:
        raise ValueError(
            f"world_size={world_size}, memory_bytes={memory_bytes}, activation_bytes="
            f"{activation_bytes}, layers={layers}: give at least one worker, some memory, "
            "activations >= 0 and at least one layer"
        )
    rows = []
    for rung in LADDER:
        if rung.tensor_parallel and tensor_parallel <= 1:
            continue
        need = rung_bytes(rung, psi, world_size, activation_bytes, layers=layers,
                          largest_unit=largest_unit, precision=precision,
                          tensor_parallel=tensor_parallel)  # fmt: skip
        grad_bytes = 2 if precision == "mixed" else 4
        sent = grad_bytes * formula_values(rung.stage, psi, world_size)
        rows.append((rung.name, need, sent))
    fits = [name for name, need, _ in rows if need <= memory_bytes]
    technique = fits[0] if fits else "none: add workers, shrink the batch or the model"
    return Choice(technique, tuple(rows), memory_bytes)
