"""Lecture 14: activation memory per rank, measured with lecture 11's counter of saved tensors.

:class:`course_lib.parallel.sharded.activations.SavedBytes` sees every tensor autograd keeps
for backward (each storage once, parameters left out); here its bytes are attributed to the
LayerNorm regions or to the rest, so the part that sequence parallelism divides by $t$ shows
on its own.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from course_lib.parallel.sharded.activations import SavedBytes

__all__ = ["saved_bytes_by_region"]


def saved_bytes_by_region(net: nn.Module, forward: Callable[[], object]) -> dict[str, int]:
    """Run ``forward()`` and return the bytes saved for backward: ``{"layernorm", "other"}``.

    A tensor is attributed to the region in which autograd first saved it.
    """
    counter = SavedBytes(net.parameters())
    counter.current = "other"

    def enter(module: nn.Module, args: object) -> None:
        counter.current = "layernorm"

    def leave(module: nn.Module, args: object, output: object) -> None:
        counter.current = "other"

    norms = [m for m in net.modules() if isinstance(m, nn.LayerNorm)]
    handles = [m.register_forward_pre_hook(enter) for m in norms]
    handles += [m.register_forward_hook(leave) for m in norms]
    try:
        with counter.hooks():
            out = forward()
    finally:
        for handle in handles:
            handle.remove()
    del out
    return {
        "layernorm": counter.per_module.get("layernorm", 0),
        "other": counter.per_module.get("other", 0),
    }
