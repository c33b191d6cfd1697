"""Lecture 12: the gradient noise scale, measured for free from the allreduce data parallelism does.

McCandlish et al., "An Empirical Model of Large-Batch Training" (2018): the *simple noise scale*
$B_{noise} = \\mathrm{tr}(\\Sigma) / |G|^2$ (Σ the per-example gradient covariance, G the true
gradient) predicts the batch size past which a larger batch buys few fewer steps. Appendix A.1
measures it from two batch sizes: a gradient's squared norm over a batch of ``b`` examples has
expectation $E|G_b|^2 = |G|^2 + \\mathrm{tr}(\\Sigma)/b$, so two sizes ``b < B`` give unbiased
estimates

$$|\\mathcal{G}|^2 = \\frac{B|G_B|^2 - b|G_b|^2}{B - b}, \\qquad
  \\mathcal{S} = \\frac{|G_b|^2 - |G_B|^2}{1/b - 1/B}.$$

Data parallelism has both for free: each rank's own gradient (batch ``b``) before the exchange,
and the averaged one (batch ``B = N b``) after it. :class:`NoiseScaleExchange` wraps a flat
exchange and appends two scalars to the buffer it already reduces (this rank's $|G_b|^2$ and
its batch size), so the mean of the ranks' $|G_b|^2$ arrives with the averaged gradient at the
cost of 8 bytes. Single-step estimates are noisy (|𝒢|² can even come out negative), so both are
smoothed by exponential moving averages before the ratio is taken, as the paper does.
Batches drawn without replacement from a finite set of ``n`` examples (an epoch's shuffle)
leave tr(Σ) unbiased up to n/(n-1) but make |𝒢|² low by tr(Σ)/(n-1): on digits (n = 1500,
B_noise ≈ 80) the ratio reads about 5 % high.
:func:`direct_noise_scale` is the reference: the same quantity from many small batches in one
process at fixed weights. The allreduce's value is a moving average over the last steps, whose
weights differ when the run trains: :func:`noise_scale_at_fixed_weights` compares the two like for
like, the engines measuring at weights that do not move (the learning rate ~0).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from course_lib.comm.communicator import Communicator
from course_lib.parallel.exchanges.base import (
    FlatExchange,
    GradientExchange,
    StepTimeline,
    flatten_grads,
    trainable_parameters,
    unflatten_into_grads,
)

__all__ = [
    "NoiseScaleExchange",
    "direct_noise_scale",
    "noise_estimates",
    "noise_scale_at_fixed_weights",
    "noise_scale_curve",
]


def noise_estimates(
    small_sq: float, big_sq: float, small_batch: float, big_batch: float
) -> tuple[float, float]:
    """Return the unbiased estimates ``(|G|^2, tr(Sigma))`` from two batch sizes' squared norms.

    ``small_sq`` is $|G_b|^2$ over a batch of ``small_batch`` examples (or the mean of several
    such), ``big_sq`` is $|G_B|^2$ over ``big_batch`` (McCandlish et al. 2018, Appendix A.1).
    """
    if not 0 < small_batch < big_batch:
        raise ValueError(f"need 0 < small batch < big batch, got b={small_batch}, B={big_batch}")
    grad_sq = (big_batch * big_sq - small_batch * small_sq) / (big_batch - small_batch)
    trace = (small_sq - big_sq) / (1.0 / small_batch - 1.0 / big_batch)
    return grad_sq, trace


class NoiseScaleExchange(GradientExchange):
    """Average gradients with ``inner`` (a flat exchange) and measure $B_{noise}$ on the way.

    Every rank records, in each step's record: ``noise_small_sq`` (the ranks' mean $|G_b|^2$),
    ``noise_big_sq`` ($|G_B|^2$), the step's raw estimates ``noise_grad_sq`` and
    ``noise_trace``, and ``noise_scale``: the ratio of their exponential moving averages
    (``smoothing`` is the EMA's decay, e.g. 0.9: about the last 10 steps). The gradients the
    optimiser sees are exactly ``inner``'s: the two extra scalars are peeled off the buffer.
    """

    name: ClassVar[str] = "noise_scale"
    checkpointable: ClassVar[bool] = False
    not_checkpointable_because: ClassVar[str] = (
        "its moving averages live on the engines, not in rank 0's weights"
    )
    sends_presence_flags: ClassVar[bool] = True
    live_notes: ClassVar[dict[str, str]] = {"noise_scale": "B_noise"}  # shown as training runs

    def __init__(self, inner: FlatExchange | None = None, smoothing: float = 0.9) -> None:
        inner = inner if inner is not None else _builtin()
        if not isinstance(inner, FlatExchange) or inner.compresses or not inner.averages_every_step:
            raise ValueError(
                f"NoiseScaleExchange needs an exchange that averages one flat float32 buffer "
                f"every step (ring, builtin, allreduce_naive), got {inner!r}: its two scalars "
                "ride in that buffer"
            )
        if not 0 <= smoothing < 1:
            raise ValueError(
                f"smoothing is an EMA decay in [0, 1) (0.9: ~10 steps), got {smoothing}"
            )
        self.inner, self.smoothing = inner, smoothing
        # The seam's facts are the inner method's: same collective, same bytes (+ 8).
        self.name = f"{inner.name}+noise_scale"
        self.cost_collective = inner.cost_collective
        self._ema = [0.0, 0.0]  # EMAs of |G|^2 and tr(Sigma)
        self._steps = 0
        self._batch = 0
        self._handle: Any = None

    def attach(self, comm: Communicator, net: nn.Module) -> nn.Module:
        """Remember each training forward's batch size (``b``); return ``inner``'s module."""
        if comm.world_size < 2:
            raise ValueError(
                "the noise scale needs two batch sizes: run on at least 2 ranks (B = N b > b)"
            )
        module = self.inner.attach(comm, net)
        self._handle = module.register_forward_pre_hook(self._on_forward)
        return module

    def _on_forward(self, module: nn.Module, args: Any) -> None:
        if module.training:
            self._batch = len(args[0])

    def exchange(self, comm: Communicator, net: nn.Module, timeline: StepTimeline) -> None:
        """Average every ``p.grad`` with ``inner``, two scalars riding along; note the estimates."""
        params = trainable_parameters(net)
        flat = flatten_grads(params, flags=True)
        values = flat[: flat.numel() - len(params)]  # the gradient, without the presence flags
        small_sq = float(values.double().square().sum())
        buffer = torch.cat([flat, torch.tensor([small_sq, float(self._batch)])])
        start = time.time()
        self.inner.average(comm, buffer.numpy())
        timeline.mark("comm", start)
        unflatten_into_grads(buffer[:-2], params, flags=True)
        mean_small_sq, small_batch = float(buffer[-2]), float(buffer[-1])
        big_sq = float(buffer[: values.numel()].double().square().sum())
        grad_sq, trace = noise_estimates(
            mean_small_sq, big_sq, small_batch, small_batch * comm.world_size
        )
        self._steps += 1
        beta = self.smoothing
        self._ema = [
            beta * e + (1 - beta) * x for e, x in zip(self._ema, (grad_sq, trace), strict=True)
        ]
        # Both EMAs carry the same start-up bias (1 - beta^t), so their ratio needs no correction.
        scale = self._ema[1] / self._ema[0] if self._ema[0] > 0 else math.inf
        for key, value in (
            ("noise_small_sq", mean_small_sq),
            ("noise_big_sq", big_sq),
            ("noise_grad_sq", grad_sq),
            ("noise_trace", trace),
            ("noise_scale", scale),
            ("noise_small_batch", small_batch),
        ):
            timeline.note(key, value)

    def detach(self) -> None:
        """Remove the batch-size hook and ``inner``'s hooks."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.inner.detach()


def _builtin() -> FlatExchange:
    from course_lib.parallel.exchanges.base import BuiltinAllreduce

    return BuiltinAllreduce()


def noise_scale_curve(
    records: list[dict[str, Any]], rank: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(steps, B_noise)`` of one rank from a run's step records (every rank's are equal)."""
    mine = sorted(
        (r["step"], r["noise_scale"]) for r in records if r["rank"] == rank and "noise_scale" in r
    )
    if not mine:
        raise ValueError(
            "these records hold no noise_scale: train with method=NoiseScaleExchange(...)"
        )
    steps, values = zip(*mine, strict=True)
    return np.array(steps), np.array(values)


def _mean_gradient(
    net: nn.Module, X: torch.Tensor, y: torch.Tensor, loss_fn: Callable
) -> torch.Tensor:
    net.zero_grad(set_to_none=True)
    loss_fn(net(X), y).backward()
    return flatten_grads(trainable_parameters(net)).double()


def direct_noise_scale(
    net: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int = 8,
    loss_fn: Callable | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Return ``{"grad_sq", "trace", "noise_scale"}`` of ``net``'s weights on ``dataset``, directly.

    The reference for :class:`NoiseScaleExchange`, in one process at fixed weights: $G$ is the
    gradient over the whole set, and $\\mathrm{tr}(\\Sigma)$ comes from one pass of many small
    batches of ``batch_size`` drawn without replacement:
    $\\mathrm{tr}(\\Sigma) = b \\frac{N-1}{N-b} \\overline{|G_b - G|^2}$ (the factor undoes the
    finite-population correction of sampling without replacement). ``net``'s gradients are
    overwritten; its weights are not changed.
    """
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    n = len(dataset)
    if not 1 <= batch_size < n:
        raise ValueError(f"batch_size must be in [1, {n - 1}] for a set of {n}, got {batch_size}")
    was_training = net.training
    net.train()
    X, y = next(iter(DataLoader(dataset, batch_size=n)))
    full = _mean_gradient(net, X, y, loss_fn)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    deviations = [
        float((_mean_gradient(net, X[idx], y[idx], loss_fn) - full).square().sum())
        for idx in order[: n // batch_size * batch_size].split(batch_size)
    ]
    net.zero_grad(set_to_none=True)
    net.train(was_training)
    trace = batch_size * (n - 1) / (n - batch_size) * float(np.mean(deviations))
    grad_sq = float(full.square().sum())
    return {"grad_sq": grad_sq, "trace": trace, "noise_scale": trace / grad_sq}


def noise_scale_at_fixed_weights(
    cluster: Any,
    net: nn.Module,
    dataset: Dataset | Callable[[], Dataset],
    *,
    batch_size: int = 128,
    epochs: int = 4,
    smoothing: float = 0.95,
    seed: int = 0,
    world_size: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Measure $B_{noise}$ of ``net``'s weights from the allreduce and directly; return both.

    The engines run ``epochs`` epochs of global batch ``batch_size`` with
    :class:`NoiseScaleExchange` at a learning rate of 1e-12: far below float32's resolution of
    the weights, so every step's gradient is taken at ``net``'s weights (checked:
    ``weights_moved`` is the largest change). The direct estimate
    (:func:`direct_noise_scale`, per-example gradients: ``batch_size=1``, no sampling noise) is
    taken at the same weights in this process. Returned: ``allreduce`` (the EMA ratio at the last
    step: what training shows), ``allreduce_mean`` (mean tr(Σ) over mean |G|² of all steps),
    ``direct``, ``steps``, ``weights_moved`` and the run (``result``).
    """
    from course_lib.parallel.data_parallel.train import train_data_parallel
    from course_lib.parallel.exchanges.base import RingAllreduce
    from course_lib.training.loop import TrainConfig

    config = TrainConfig(num_epochs=epochs, lr=1e-12, batch_size=batch_size, seed=seed)
    result = train_data_parallel(
        cluster,
        model=net,
        dataset=dataset,
        config=config,
        method=NoiseScaleExchange(RingAllreduce(), smoothing=smoothing),
        world_size=world_size,
        progress=progress,
        comm_timeout=60,
        timeout=600,
    )
    mine = sorted((r for r in result.records if r["rank"] == 0), key=lambda r: r["step"])
    before = dict(net.named_parameters())
    moved = max(
        float(np.abs(result.weights[k] - p.detach().numpy()).max()) for k, p in before.items()
    )
    data = dataset() if callable(dataset) and not isinstance(dataset, Dataset) else dataset
    direct = direct_noise_scale(copy.deepcopy(net), data, batch_size=1)
    return {
        "allreduce": mine[-1]["noise_scale"],
        "allreduce_mean": float(np.mean([r["noise_trace"] for r in mine]))
        / float(np.mean([r["noise_grad_sq"] for r in mine])),
        "direct": direct["noise_scale"],
        "steps": len(mine),
        "weights_moved": moved,
        "result": result,
    }
