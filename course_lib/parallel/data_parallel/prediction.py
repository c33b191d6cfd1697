"""Lecture 4: predicted step time and speed-up of data-parallel training, from the alpha-beta model.

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
from course_lib.parallel.exchanges.base import GradientExchange
from course_lib.parallel.exchanges.registry import EXCHANGES

__all__ = ["StepPrediction", "modelled_methods", "predict_step"]


def modelled_methods() -> list[str]:
    """Return the registered methods whose class names the collective it pays (``cost_collective``)."""
    return [name for name, cls in EXCHANGES.items() if cls.cost_collective is not None]


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
    method: str | GradientExchange,
    *,
    nbytes: float,
    world_size: int,
    global_batch: int,
    compute_per_sample: float,
    link: LinkModel,
) -> StepPrediction:
    """Return the predicted step of ``method`` on ``world_size`` ranks over ``link``.

    Args:
        method: an exchange (or its name); its class's ``cost_collective`` is what it pays.
        nbytes: the gradient's size in bytes (float32: 4 per trainable value).
        compute_per_sample: seconds of forward + backward per sample on one rank (measured).
    """
    cls = type(method) if isinstance(method, GradientExchange) else EXCHANGES.get(method)
    if cls is None or cls.cost_collective is None:
        raise ValueError(
            f"no cost model for method {method!r}; choose one of {', '.join(modelled_methods())}"
        )
    if world_size < 1 or global_batch < world_size:
        raise ValueError(
            f"need 1 <= world_size <= global_batch, got world_size={world_size}, "
            f"global_batch={global_batch}: every rank needs at least one sample"
        )
    if compute_per_sample < 0 or nbytes < 0:
        raise ValueError("compute_per_sample and nbytes must be >= 0")
    exchange = predict(cls.cost_collective, nbytes, world_size, link) if world_size > 1 else 0.0
    return StepPrediction(
        compute_s=compute_per_sample * global_batch / world_size,
        exchange_s=exchange,
        single_s=compute_per_sample * global_batch,
    )
