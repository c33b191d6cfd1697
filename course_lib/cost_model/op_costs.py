"""Lecture 13: What one operator shard costs: measured once on this machine, or derived from FLOPs.

FlexFlow (source 003) runs every operator once per configuration and keeps the time; it never
guesses. :class:`MeasuredCosts` does the same with torch on this machine's CPU: the shard an
operator has under a configuration (a quarter of the batch, half the neurons, a band of image rows
with its halo) is built as a torch layer, its forward and backward timed several times and the
*minimum* kept (load only ever adds time: the minimum is the cost, :func:`course_lib.timing.min_of`'s
rule), and the result cached in ``datasets/cache/op_costs.json`` under this machine's description,
so a second search measures nothing. The spread of the repeats is kept beside the cost, and
:func:`backward_ratio_sentence` checks a dense layer's backward against its ~2× forward (two
products for one): a ratio far from it says the timing was disturbed, in words. :class:`FlopsCosts` derives times from FLOPs at a stated rate instead: the way
to predict hardware we do not have (a paper's GPUs), labelled as such.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from course_lib.cost_model.configs import ParallelConfig, in_boxes, shard_scale
from course_lib.cost_model.operators import Operator
from course_lib.data.paths import cache_dir
from course_lib.files import atomic_write_bytes

__all__ = [
    "FlopsCosts",
    "MeasuredCosts",
    "DENSE_BACKWARD_RATIO",
    "backward_ratio_sentence",
    "machine_description",
    "shard_signature",
    "time_shard",
]


#: A dense layer's backward computes two products of its forward's size (dX = dY Wᵀ, dW = Xᵀ dY).
DENSE_BACKWARD_RATIO = 2.0
#: Measured ratios outside this band (of the 2×) say that load or a cold cache disturbed the timing.
RATIO_BAND = (1.2, 3.5)
#: A cost whose repeats spread wider than this fraction of it is reported as untrustworthy.
SPREAD_LIMIT = 0.5
_CACHE_VERSION = "min-of-repeats"  # entries timed as medians (before) are not reused


def backward_ratio_sentence(forward: float, backward: float) -> tuple[bool, str]:
    """Return (trustworthy, sentence) for a dense layer's measured backward / forward ratio."""
    ratio = backward / forward if forward > 0 else float("inf")
    lo, hi = RATIO_BAND
    if lo <= ratio <= hi:
        return True, (
            f"backward {ratio:.1f}x the forward: near the {DENSE_BACKWARD_RATIO:.0f}x of a dense "
            "layer (two products for one), so these timings are trustworthy"
        )
    return False, (
        f"WARNING: backward {ratio:.1f}x the forward, far from the {DENSE_BACKWARD_RATIO:.0f}x of a "
        "dense layer: the machine was busy while timing. The costs below use the formula's "
        f"{DENSE_BACKWARD_RATIO:.0f}x instead; re-run on a quiet machine (delete "
        "datasets/cache/op_costs.json) to measure it"
    )


class FlopsCosts:
    """Forward time = shard FLOPs / ``flops_per_s``; backward = ``backward_ratio`` x forward.

    Backward of a linear or convolution computes two products (input and weight gradients) for
    the forward's one, hence the usual ratio of 2.
    """

    def __init__(self, flops_per_s: float, backward_ratio: float = 2.0) -> None:
        if flops_per_s <= 0 or backward_ratio < 0:
            raise ValueError(
                f"need flops_per_s > 0 and backward_ratio >= 0, got {flops_per_s}, {backward_ratio}"
            )
        self.flops_per_s, self.backward_ratio = flops_per_s, backward_ratio

    def __call__(self, op: Operator, cfg: ParallelConfig, batch: int) -> tuple[float, float]:
        """Return (forward, backward) seconds of one worker's shard of ``op`` under ``cfg``."""
        fwd = op.flops * batch * shard_scale(op, cfg) / self.flops_per_s
        return fwd, self.backward_ratio * fwd


def machine_description(threads: int) -> str:
    """Return what makes a time measured here valid: CPU, cores, torch version and threads."""
    import torch

    return (
        f"{platform.machine()} {platform.processor() or platform.system()} "
        f"cpus={os.cpu_count()} torch={torch.__version__} threads={threads}"
    )


def shard_signature(op: Operator, cfg: ParallelConfig, batch: int) -> tuple:
    """Return (kind, batch, input shape, output width, attrs) of the first worker's shard."""
    (_, box), n = in_boxes(op, cfg, batch)[0], cfg.degree
    sizes = tuple(b - a for a, b in box)
    width = op.out_shape[0]
    if cfg.split == "column" and op.kind in ("linear", "conv2d", "upconv"):
        width //= n
    return (op.kind, sizes[0], sizes[1:], width, op.attrs)


def _layer(kind: str, in_shape: tuple, width: int, attrs: tuple):
    import torch
    from torch import nn

    if kind == "linear":
        return nn.Linear(in_shape[0], width)
    if kind == "conv2d":
        k, p, s = attrs
        return nn.Conv2d(in_shape[0], width, k, padding=p, stride=s)
    if kind == "upconv":
        k, _, s = attrs
        return nn.ConvTranspose2d(in_shape[0], width, k, stride=s)
    if kind == "maxpool":
        return nn.MaxPool2d(attrs[0], attrs[2])
    if kind == "concat":
        return lambda x: x * 1.0  # a copy of both inputs into one buffer
    if kind == "relu":
        return nn.ReLU()
    return lambda x: torch.nn.functional.cross_entropy(
        x, torch.zeros((len(x), *x.shape[2:]), dtype=torch.long)
    )


def time_shard(signature: tuple, repeats: int, threads: int) -> tuple[float, float, float, float]:
    """Return the fastest (forward, backward) seconds of one shard on ``threads`` over ``repeats``
    (after 2 warm-ups), and each one's spread: (max − min) / min of the repeats."""
    import torch

    kind, batch, in_shape, width, attrs = signature
    layer = _layer(kind, in_shape, width, attrs)
    X = torch.randn(batch, *in_shape, requires_grad=True)
    fwd, bwd = [], []
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rep in range(repeats + 2):  # warm-ups allocate buffers and pick kernels
            t0 = time.perf_counter()
            out = layer(X)
            t1 = time.perf_counter()
            out.backward(torch.ones_like(out))
            t2 = time.perf_counter()
            X.grad = None
            if rep >= 2:
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
    finally:
        torch.set_num_threads(before)

    def spread(v: list[float]) -> float:
        return (max(v) - min(v)) / min(v) if min(v) > 0 else 0.0

    return min(fwd), min(bwd), spread(fwd), spread(bwd)


class MeasuredCosts:
    """Forward and backward seconds of each operator shard, timed here once and cached on disk.

    ``path`` defaults to ``datasets/cache/op_costs.json``; entries are keyed by
    :func:`machine_description`, so a cache copied from another machine is not trusted.
    ``threads``: torch threads while timing, 1 by default as on the kit's local engines (two
    cores shared by two engines); also steadier on a loaded machine. ``measured`` counts the
    shards this object timed (the others came from the cache); :meth:`spread` the spread of
    a cost's repeats, :meth:`noisy` the costs whose spread exceeds :data:`SPREAD_LIMIT`.
    """

    def __init__(
        self, path: str | os.PathLike | None = None, repeats: int = 7, threads: int = 1
    ) -> None:
        if repeats < 1 or threads < 1:
            raise ValueError(f"need repeats >= 1 and threads >= 1, got {repeats}, {threads}")
        self.path = Path(path) if path else cache_dir() / "op_costs.json"
        self.repeats, self.threads = repeats, threads
        self.machine = f"{machine_description(threads)} {_CACHE_VERSION}"
        self.measured = 0
        self._table = json.loads(self.path.read_text()) if self.path.exists() else {}

    def __call__(self, op: Operator, cfg: ParallelConfig, batch: int) -> tuple[float, float]:
        """Return (forward, backward) seconds of one worker's shard of ``op`` under ``cfg``."""
        if op.kind == "flatten":
            return 0.0, 0.0  # a view: no arithmetic, nothing to time
        signature = shard_signature(op, cfg, batch)
        key = repr(signature)
        mine = self._table.setdefault(self.machine, {})
        if key not in mine:
            mine[key] = list(time_shard(signature, self.repeats, self.threads))
            self.measured += 1
            atomic_write_bytes(self.path, json.dumps(self._table, indent=1).encode())
        fwd, bwd = mine[key][:2]
        return float(fwd), float(bwd)

    def spread(self, op: Operator, cfg: ParallelConfig, batch: int) -> float:
        """Return the wider of the forward's and backward's spreads over their repeats (0 if unknown)."""
        self(op, cfg, batch)
        if op.kind == "flatten":
            return 0.0
        entry = self._table[self.machine][repr(shard_signature(op, cfg, batch))]
        return max(entry[2:4]) if len(entry) >= 4 else 0.0

    def noisy(self, ops, cfg: ParallelConfig, batch: int) -> list[str]:
        """Return the names of ``ops`` whose cost under ``cfg`` spread wider than :data:`SPREAD_LIMIT`."""
        return [op.name for op in ops if self.spread(op, cfg, batch) > SPREAD_LIMIT]
