"""Lecture 11: Gradient accumulation as a memory tool, and DDP's ``no_sync``.

A step on a batch of ``B`` samples keeps the activations of all ``B`` until backward. Cut the
batch into ``k`` micro-batches, run forward and backward on each in turn and let the gradients
add up in ``.grad``: only one micro-batch's activations are alive at a time (about ``1/k`` of
them), and the sum of the micro-batch gradients, each loss weighted by its share ``b_i / B``, is
the big batch's mean gradient, up to the order of float additions. The price is ``k`` smaller
(less efficient) passes instead of one.

Under data parallelism each backward would also average the gradients across ranks. Averaging
is linear, so it may wait for the last micro-batch: PyTorch's ``DistributedDataParallel`` skips
its allreduce inside ``with model.no_sync():`` and :func:`accumulate_gradients` runs the first
``k - 1`` micro-batches there, one exchange per step instead of ``k``.

Activation bytes are measured as in :mod:`.activations`: a saved-tensor hook sees every tensor
autograd keeps during the model's forward (each tensor once, parameters left out).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["accumulate_gradients", "accumulation_memory"]


def _forward_measured(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Run ``model(x)``; return the output and the activation bytes autograd saved for backward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[tuple[int, int]] = set()
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        # a view counts its own bytes (a micro-batch is a view of the batch), each tensor once
        key = (t.data_ptr(), t.nbytes)
        if t.nbytes and key not in seen and t.untyped_storage().data_ptr() not in params:
            seen.add(key)
            total[0] += t.nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    return out, total[0]


def accumulate_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    k: int,
    loss_fn: Callable = nn.functional.cross_entropy,
    no_sync: bool = True,
) -> dict[str, float]:
    """Add to ``.grad`` the gradient of ``loss_fn(model(x), y)`` computed in ``k`` micro-batches.

    Each micro-batch's loss is weighted by its share of the batch, so the accumulated gradient is
    the whole batch's (a mean loss). A ``DistributedDataParallel`` model runs the first ``k - 1``
    backwards under ``model.no_sync()``: it exchanges gradients once, after the last
    (``no_sync=False`` exchanges after every micro-batch: ``k`` times as many, the same result).
    Zero the gradients before; step the optimiser after.

    Returns the batch's ``loss`` and ``peak_activation_bytes``, the most activation bytes held
    at once (one micro-batch's: each is freed by its backward before the next forward).
    """
    if not 1 <= k <= len(x):
        raise ValueError(
            f"k={k} micro-batches of a batch of {len(x)} samples: choose 1 <= k <= {len(x)} "
            "(every micro-batch needs at least one sample)"
        )
    skipper = getattr(model, "no_sync", None) if no_sync else None
    loss_sum, peak = 0.0, 0
    for i, (xs, ys) in enumerate(zip(x.tensor_split(k), y.tensor_split(k), strict=True)):
        skip = skipper() if skipper is not None and i < k - 1 else contextlib.nullcontext()
        with skip:
            out, held = _forward_measured(model, xs)
            loss = loss_fn(out, ys) * (len(xs) / len(x))
            loss.backward()
        peak = max(peak, held)
        loss_sum += loss.item()
    return {"loss": loss_sum, "peak_activation_bytes": peak}


def accumulation_memory(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    k: int,
    loss_fn: Callable = nn.functional.cross_entropy,
) -> dict[str, float]:
    """Measure one step on the whole batch against ``k`` micro-batches accumulated.

    Returns the peak activation bytes of each (``batch_bytes``, ``accumulated_bytes``) and the
    largest difference between their gradients relative to the largest gradient value
    (``grad_difference``: float rounding only). ``model``'s gradients are left zeroed.
    """
    grads, out = {}, {}
    for label, parts in (("batch", 1), ("accumulated", k)):
        model.zero_grad(set_to_none=True)
        out[f"{label}_bytes"] = accumulate_gradients(model, x, y, parts, loss_fn)[
            "peak_activation_bytes"
        ]
        grads[label] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    scale = max(float(g.abs().max()) for g in grads["batch"])
    out["grad_difference"] = max(
        float((a - b).abs().max())
        for a, b in zip(grads["batch"], grads["accumulated"], strict=True)
    ) / max(scale, 1e-30)
    return out
