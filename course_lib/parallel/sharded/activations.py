"""Lecture 11: Activation memory, measured, and recomputation (activation checkpointing) trading it for time.

Autograd keeps, from forward until backward, the tensors each operation needs for its gradient
(``Linear`` its input, ``ReLU`` its output): the *activations*. They are measured here from the
tensors themselves: a ``torch.autograd.graph.saved_tensors_hooks`` pack hook sees every tensor
autograd saves, and each storage is counted once (a ``ReLU`` output that the next ``Linear``
saves again is one tensor); the parameters, which autograd also saves, are held anyway and are
left out. For an MLP with batch ``B``, ``d`` inputs and hidden widths ``h_i``, that is
``4 B (d + sum h_i)`` bytes in float32.

Recomputation (Chen et al. 2016, ``torch.utils.checkpoint``) keeps only each segment's input
and runs the segment's forward again during backward: with ``k`` segments the activations
shrink to about one segment's plus the ``k`` boundaries, and the step grows by about one
forward pass. :func:`recomputation_cost` measures both.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "ActivationMemory",
    "SavedBytes",
    "activation_memory",
    "recomputation_cost",
    "transformer_activation_bytes",
]


@dataclass(frozen=True)
class ActivationMemory:
    """Bytes held for backward after one forward: saved by autograd, kept for recomputation."""

    saved_bytes: int  # tensors autograd saved (parameters excluded)
    kept_bytes: int  # segment inputs the checkpoints keep to run their forward again
    per_module: dict[str, int]  # saved bytes attributed to the module that saved them first

    @property
    def total_bytes(self) -> int:
        """All activation bytes held between forward and backward."""
        return self.saved_bytes + self.kept_bytes


def _segments(net: nn.Sequential, segments: int) -> list[nn.Sequential]:
    """Cut ``net`` into ``segments`` contiguous runs of modules (the first ones one longer)."""
    if not isinstance(net, nn.Sequential) or not 1 <= segments <= len(net):
        raise ValueError(
            f"recomputation cuts an nn.Sequential into 1..{len(net)} segments; got "
            f"segments={segments} for {type(net).__name__}: pass an nn.Sequential and a "
            "segment count no larger than its number of modules"
        )
    base, extra = divmod(len(net), segments)
    modules, runs, start = list(net), [], 0
    for i in range(segments):
        stop = start + base + (i < extra)
        runs.append(nn.Sequential(*modules[start:stop]))  # shares the modules: no copies
        start = stop
    return runs


def _forward(net: nn.Module, x: torch.Tensor, segments: int) -> tuple[torch.Tensor, list]:
    """Run forward, checkpointing every segment but the last (``segments=0``: no checkpoints)."""
    if segments == 0:
        return net(x), []
    kept, h = [], x
    runs = _segments(net, segments)
    for run in runs[:-1]:  # the last segment's activations are used at once: no point saving
        kept.append(h)
        h = checkpoint(run, h, use_reentrant=False)
    return runs[-1](h), kept


class SavedBytes:
    """Counts the bytes autograd saves for backward, each storage once, parameters left out.

    Use :meth:`hooks` as a context around a forward (or call :meth:`pack` from one): ``total`` is
    then the activation bytes that forward leaves for backward, ``per_module`` the same by the
    name in ``current`` when each storage was first saved. The parameters' storages are looked
    up at each save (a stage-3 unit's flat buffer is allocated again for every forward).
    """

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.params = list(params)
        self.seen: set[int] = set()
        self.per_module: dict[str, int] = {}
        self.current = "input"

    @property
    def total(self) -> int:
        """Bytes saved so far."""
        return sum(self.per_module.values())

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """The pack hook: count ``t``'s storage unless already counted or a parameter's."""
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() and key not in self.seen:
            if key not in {p.untyped_storage().data_ptr() for p in self.params}:
                self.seen.add(key)
                self.per_module[self.current] = (
                    self.per_module.get(self.current, 0) + storage.nbytes()
                )
        return t

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """Return the ``saved_tensors_hooks`` context that counts with :meth:`pack`."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, _unpack)


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def activation_memory(net: nn.Module, x: torch.Tensor, segments: int = 0) -> ActivationMemory:
    """Measure the activation bytes one forward of ``net`` on ``x`` leaves for backward.

    ``segments`` > 0 checkpoints ``net`` (an ``nn.Sequential``) in that many segments: only each
    segment's input is kept (``kept_bytes``), the rest is recomputed during backward.
    """
    counter = SavedBytes(net.parameters())
    names = {id(m): name for name, m in net.named_modules() if name}

    def enter(module: nn.Module, args: object) -> None:
        counter.current = names.get(id(module), counter.current)

    handles = [m.register_forward_pre_hook(enter) for m in net.modules() if id(m) in names]
    try:
        with counter.hooks():
            out, kept = _forward(net, x, segments)
    finally:
        for handle in handles:
            handle.remove()
    seen = counter.seen
    per_module = counter.per_module
    kept_bytes = 0
    for t in kept:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            kept_bytes += t.untyped_storage().nbytes()
    del out
    return ActivationMemory(sum(per_module.values()), kept_bytes, per_module)


def recomputation_cost(
    net: nn.Module, x: torch.Tensor, y: torch.Tensor, segments: int, repeats: int = 5
) -> dict[str, Any]:
    """Measure activation bytes and the forward + backward time, without and with checkpoints.

    The time is the fastest of ``repeats`` runs (as ``timeit`` does: on a shared machine the
    slower runs measure the other programs), the plain and checkpointed runs taking turns so
    that both see the same load.

    Returns ``plain_bytes``, ``checkpointed_bytes``, ``plain_s``, ``checkpointed_s`` (and every
    run's seconds, ``plain_samples`` and ``checkpointed_samples``), and the
    checkpointed run's gradients' largest difference from the plain run's (``grad_difference``:
    recomputation must give the same gradients).
    """
    variants = (("plain", 0), ("checkpointed", segments))
    out: dict[str, Any] = {
        f"{label}_bytes": activation_memory(net, x, k).total_bytes for label, k in variants
    }
    times: dict[str, list[float]] = {label: [] for label, _ in variants}
    grads = {}
    for _ in range(repeats):
        for label, k in variants:
            net.zero_grad(set_to_none=True)
            start = time.perf_counter()
            logits, _ = _forward(net, x, k)
            nn.functional.cross_entropy(logits, y).backward()
            times[label].append(time.perf_counter() - start)
            grads[label] = [p.grad.clone() for p in net.parameters()]
    for label, _ in variants:
        out[f"{label}_s"] = min(times[label])
        out[f"{label}_samples"] = tuple(times[label])  # every run, for course_lib.timing
    net.zero_grad(set_to_none=True)
    out["grad_difference"] = max(
        float((a - b).abs().max())
        for a, b in zip(grads["plain"], grads["checkpointed"], strict=True)
    )
    return out


def transformer_activation_bytes(
    seq: int, batch: int, width: int, layers: int, heads: int | None = None
) -> float:
    """Return a transformer's activation bytes in 16-bit (Korthikanti et al. 2022, equation 1).

    Per layer $s b h (34 + 5 a s / h)$: ``heads`` = $a$ gives the textbook attention's $s^2$
    term; None leaves it out, as a fused attention kernel keeps no probabilities (a **prediction**).
    """
    quadratic = 5 * heads * seq / width if heads else 0.0
    return seq * batch * width * (34 + quadratic) * layers
