"""Predicted step time and speed-up of data-parallel training, from the alpha-beta cost model.

One step on N ranks with global batch B is forward + backward on B / N samples, then the
gradient exchange of S bytes; one process does B samples and no exchange. So

$$ t_N = c \\cdot B / N + t_{\\text{exchange}}(S, N), \\qquad
   \\text{speed-up} = \\frac{c \\cdot B}{t_N} $$

with ``c`` the measured seconds of forward + backward per sample and the exchange's time from
:func:`course_lib.cost_model.alpha_beta.predict`. These are predictions: overlap (buckets, DDP), waiting
for a slow rank and the optimiser step are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.cost_model.alpha_beta import LinkModel, predict

__all__ = ["EXCHANGE_ALGORITHM", "StepPrediction", "predict_step"]

#: The collective whose cost each exchange method pays (bucketed and DDP: ring, overlap ignored).
EXCHANGE_ALGORITHM = {
    "parameter_server": "star_allreduce",
    "parameter_server_source000": "star_allreduce",
    "allreduce_naive": "allreduce_naive",
    "ring": "ring_allreduce",
    "builtin": "ring_allreduce",
    "bucketed": "ring_allreduce",
    "ddp": "ring_allreduce",
}


@dataclass(frozen=True)
class StepPrediction:
    """Predicted seconds of one step: ``compute`` (forward + backward) and ``exchange``."""

    compute_s: float
    exchange_s: float
    single_s: float  # one process, whole global batch, no exchange

    @property
    def total_s(self) -> float:
        """Return the predicted seconds of one step on N ranks."""
        return self.compute_s + self.exchange_s

    @property
    def speedup(self) -> float:
        """Return one process's step time over N ranks' (same global batch)."""
        return self.single_s / self.total_s if self.total_s > 0 else 1.0

    @property
    def exchange_share(self) -> float:
        """Return the fraction of the step spent exchanging gradients."""
        return self.exchange_s / self.total_s if self.total_s > 0 else 0.0


def predict_step(
    method: str,
    *,
    nbytes: float,
    world_size: int,
    global_batch: int,
    compute_per_sample: float,
    link: LinkModel,
) -> StepPrediction:
    """Return the predicted step of ``method`` on ``world_size`` ranks over ``link``.

    Args:
        nbytes: the gradient's size in bytes (float32: 4 per trainable value).
        compute_per_sample: seconds of forward + backward per sample on one rank (measured).
    """
    if method not in EXCHANGE_ALGORITHM:
        raise ValueError(
            f"unknown method {method!r}; choose one of {', '.join(EXCHANGE_ALGORITHM)}"
        )
    if world_size < 1 or global_batch < world_size:
        raise ValueError(
            f"need 1 <= world_size <= global_batch, got world_size={world_size}, "
            f"global_batch={global_batch}: every rank needs at least one sample"
        )
    if compute_per_sample < 0 or nbytes < 0:
        raise ValueError("compute_per_sample and nbytes must be >= 0")
    exchange = (
        predict(EXCHANGE_ALGORITHM[method], nbytes, world_size, link) if world_size > 1 else 0.0
    )
    return StepPrediction(
        compute_s=compute_per_sample * global_batch / world_size,
        exchange_s=exchange,
        single_s=compute_per_sample * global_batch,
    )
