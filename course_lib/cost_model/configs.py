"""Lecture 13: How one operator's work is split over workers: the SOAP configurations of source 003.

A :class:`ParallelConfig` says which dimension of an operator is split and over which workers:

- ``sample``: the batch (data parallelism; the weights are replicated and their gradients summed);
- ``column``: the parameters by output neurons or channels (tensor parallelism; every worker
  needs the whole input);
- ``row``: a linear layer's parameters by input features (Megatron's row-parallel half: partial
  sums, allreduced forward);
- ``attribute``: a convolution or pooling by image height (each worker needs a halo of rows from
  its neighbours);
- ``replicate``: every worker computes the whole operator (no split, no exchange of its weights).

Which workers (``devices``) is the Operator dimension: two operators on different workers are
pipeline stages. A strategy is one configuration per operator. Each configuration also says which
part of the input every worker needs (``in_boxes``) and which part of the output it holds
(``out_boxes``), as index boxes; the task graph moves the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.cost_model.operators import Operator, OperatorGraph

__all__ = [
    "SPLITS",
    "ParallelConfig",
    "candidates",
    "check_config",
    "check_strategy",
    "data_parallel",
    "expert_hybrid",
    "in_boxes",
    "out_boxes",
    "shard_scale",
]

SPLITS = ("sample", "column", "row", "attribute", "replicate")
Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension, batch first


@dataclass(frozen=True)
class ParallelConfig:
    """Split ``split`` of one operator over ``devices`` (worker indices, one shard each)."""

    split: str
    devices: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"unknown split {self.split!r}; choose one of {SPLITS}")
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise ValueError(f"devices must be distinct worker indices, got {self.devices}")
        object.__setattr__(self, "_hash", hash((self.split, self.devices)))

    def __hash__(self) -> int:  # computed once: configurations key the simulator's caches
        return self._hash

    @property
    def degree(self) -> int:
        """Return the number of workers the operator is split over."""
        return len(self.devices)

    def __str__(self) -> str:
        return f"{self.split}@{','.join(map(str, self.devices))}"


def _dim(op: Operator, split: str) -> tuple[int, str]:
    """Return (size, what) of the operator's dimension that ``split`` cuts."""
    if split == "column":
        return op.out_shape[0], "output channels" if op.kind == "conv2d" else "output features"
    if split == "row":
        return op.in_shape[0], "input features"
    return op.out_shape[1], "output rows (image height)"


def check_config(op: Operator, cfg: ParallelConfig, batch: int, world_size: int) -> None:
    """Raise ValueError, naming the fix, if ``cfg`` cannot run ``op`` on ``world_size`` workers."""
    if max(cfg.devices) >= world_size or min(cfg.devices) < 0:
        raise ValueError(
            f"{op.name}: {cfg} uses workers {cfg.devices} but only {world_size} are given "
            f"(0..{world_size - 1}); use fewer workers or a larger cluster"
        )
    n, split = cfg.degree, cfg.split
    if split == "row" and op.kind != "linear":
        raise ValueError(
            f"{op.name}: a row split cuts a linear layer's inputs, not a {op.kind}; "
            "use column, sample or replicate"
        )
    if split == "column" and (
        op.kind == "loss" or (op.kind == "flatten" and len(op.in_shape) != 3)
    ):
        raise ValueError(f"{op.name}: a {op.kind} has no columns to split; use sample or replicate")
    if split == "attribute" and (
        op.kind not in ("conv2d", "maxpool", "relu", "concat") or len(op.out_shape) != 3
    ):
        raise ValueError(
            f"{op.name}: an attribute (height) split needs an image operator "
            f"(conv2d, maxpool, relu or concat on images), not {op.kind}; use sample"
        )
    if split == "sample" and batch % n:
        raise ValueError(
            f"{op.name}: a batch of {batch} does not split over {n} workers; "
            f"use a degree that divides {batch} or a batch that is a multiple of {n}"
        )
    if split in ("column", "row", "attribute"):
        size, what = (op.in_shape[0], "input channels") if op.kind == "flatten" else _dim(op, split)
        if size % n:
            divisors = [d for d in range(1, min(size, world_size) + 1) if size % d == 0]
            raise ValueError(
                f"{op.name}: {size} {what} do not split over {n} workers; "
                f"choose a degree in {divisors}"
            )


def check_strategy(graph: OperatorGraph, strategy: tuple[ParallelConfig, ...], world_size: int):
    """Raise ValueError naming the fix unless ``strategy`` gives every operator a valid config."""
    if len(strategy) != len(graph.ops):
        raise ValueError(
            f"{graph.name} has {len(graph.ops)} operators, the strategy gives "
            f"{len(strategy)} configurations: give one per operator"
        )
    for op, cfg in zip(graph.ops, strategy, strict=True):
        check_config(op, cfg, graph.batch, world_size)


def _part(size: int, n: int, j: int) -> tuple[int, int]:
    return j * size // n, (j + 1) * size // n


def _full(batch: int, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(0, batch)] + [(0, s) for s in shape]


def out_boxes(op: Operator, cfg: ParallelConfig, batch: int) -> list[tuple[int, Box]]:
    """Return ``(worker, box)`` of the output each worker holds after the forward pass."""
    n, out = cfg.degree, []
    for j, d in enumerate(cfg.devices):
        box = _full(batch, op.out_shape)
        if cfg.split == "sample":
            box[0] = _part(batch, n, j)
        elif cfg.split == "column":
            box[1] = _part(op.out_shape[0], n, j)
        elif cfg.split == "attribute":
            box[2] = _part(op.out_shape[1], n, j)
        out.append((d, tuple(box)))  # row and replicate: every worker holds the whole output
    return out


def in_boxes(op: Operator, cfg: ParallelConfig, batch: int) -> list[tuple[int, Box]]:
    """Return ``(worker, box)`` of the input each worker needs (halo rows included)."""
    n, out = cfg.degree, []
    for j, d in enumerate(cfg.devices):
        box = _full(batch, op.in_shape)
        if cfg.split == "sample":
            box[0] = _part(batch, n, j)
        elif cfg.split == "row" or (
            cfg.split == "column" and op.kind in ("relu", "maxpool", "flatten", "concat")
        ):
            box[1] = _part(op.in_shape[0], n, j)  # elementwise by channel: own channels only
        elif cfg.split == "attribute":
            o0, o1 = _part(op.out_shape[1], n, j)
            k, p, s = op.attrs or (1, 0, 1)
            box[2] = (max(0, o0 * s - p), min(op.in_shape[1], (o1 - 1) * s - p + k))  # halo
        out.append((d, tuple(box)))  # column (linear, conv2d) and replicate: the whole input
    return out


def shard_scale(op: Operator, cfg: ParallelConfig) -> float:
    """Return the fraction of the operator's arithmetic one worker does under ``cfg``."""
    return 1.0 if cfg.split == "replicate" else 1.0 / cfg.degree


def candidates(op: Operator, batch: int, world_size: int, degrees=None) -> list[ParallelConfig]:
    """Return every valid config of ``op``: each split, degree (power of two) and aligned block."""
    degrees = degrees or [d for d in (1, 2, 4, 8, 16, 32) if d <= world_size]
    out = []
    for n in degrees:
        for start in range(0, world_size - n + 1, n):
            for split in SPLITS if n > 1 else ("replicate",):
                cfg = ParallelConfig(split, tuple(range(start, start + n)))
                try:
                    check_config(op, cfg, batch, world_size)
                except ValueError:
                    continue
                out.append(cfg)
    return out


def data_parallel(graph: OperatorGraph, world_size: int) -> tuple[ParallelConfig, ...]:
    """Return pure data parallelism: every operator split by samples over every worker."""
    cfg = ParallelConfig("sample" if world_size > 1 else "replicate", tuple(range(world_size)))
    return tuple(cfg for _ in graph.ops)


def expert_hybrid(graph: OperatorGraph, world_size: int) -> tuple[ParallelConfig, ...]:
    """Return Krizhevsky's hybrid: data-parallel convolutions, column -> row pairs of dense layers.

    Up to the flatten, sample split; then linear layers alternate column and row (Megatron pairs,
    :mod:`course_lib.parallel.model_parallel.hybrid`), the ReLU after a column layer stays split
    by columns, the one after a row layer and the loss are replicated.
    """
    devices = tuple(range(world_size))
    if world_size == 1:
        return tuple(ParallelConfig("replicate", devices) for _ in graph.ops)
    out, dense, column_open = [], False, False
    for op in graph.ops:
        if op.kind == "linear":
            dense = True
            column_open = not column_open
            split = "column" if column_open else "row"
        elif dense:
            split = "column" if column_open and op.kind == "relu" else "replicate"
        else:
            split = "sample"
        out.append(ParallelConfig(split, devices))
    return tuple(out)
