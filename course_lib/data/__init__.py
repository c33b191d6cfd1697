"""Lecture 1: Datasets for the course: small ones that work offline, real ones through torchvision, shards.

``load_dataset(name)`` is the one entry point; every set comes back as a ``TensorDataset`` of
``X`` (float32, N x C x H x W, values in [0, 1]) and ``y`` (int64 class labels, or N x H x W
masks for segmentation). Files live under ``datasets/`` (see :mod:`course_lib.data.paths`).
"""

from __future__ import annotations

import os

from torch.utils.data import TensorDataset

from course_lib.data.digits import digits_arrays, load_digits
from course_lib.data.paths import ENV_VAR, cache_dir, datasets_dir
from course_lib.data.segmentation import (
    CLASS_COLOURS,
    CLASS_NAMES,
    IGNORE_INDEX,
    generate_vaihingen_tiles,
    load_segmentation,
    load_vaihingen_tiles,
    mask_to_rgb,
    rgb_to_mask,
    write_vaihingen_tiles,
)
from course_lib.data.sharding import ShardSampler, shard_indices
from course_lib.data.text import load_text
from course_lib.data.torchvision_sets import (
    TORCHVISION_SETS,
    DatasetUnavailableError,
    load_torchvision,
)

__all__ = [
    "KNOWN_DATASETS",
    "load_dataset",
    "load_digits",
    "load_text",
    "digits_arrays",
    "load_torchvision",
    "DatasetUnavailableError",
    "load_segmentation",
    "generate_vaihingen_tiles",
    "write_vaihingen_tiles",
    "load_vaihingen_tiles",
    "mask_to_rgb",
    "rgb_to_mask",
    "CLASS_NAMES",
    "CLASS_COLOURS",
    "IGNORE_INDEX",
    "shard_indices",
    "ShardSampler",
    "datasets_dir",
    "cache_dir",
    "ENV_VAR",
]

#: Every name ``load_dataset`` accepts.
KNOWN_DATASETS = ("digits", *TORCHVISION_SETS, "segmentation", "vaihingen", "text")


def load_dataset(
    name: str,
    *,
    train: bool = True,
    root: str | os.PathLike | None = None,
    **kwargs,
) -> TensorDataset:
    """Load dataset ``name`` (one of ``KNOWN_DATASETS``) as a ``TensorDataset``.

    ``kwargs`` go to the specific loader: ``download`` for torchvision sets; ``num_tiles``,
    ``tile_size``, ``seed`` for ``"segmentation"``; ``tile_size`` for ``"vaihingen"`` (real tiles
    in ``<datasets>/vaihingen/{top,gts}``, or in ``root`` if given).
    """
    key = name.lower().replace("-", "_")
    if key == "digits":
        return load_digits(train=train)
    if key in TORCHVISION_SETS:
        return load_torchvision(key, train=train, root=root, **kwargs)
    if key == "segmentation":
        return load_segmentation(train=train, **kwargs)
    if key == "vaihingen":
        folder = root if root is not None else datasets_dir() / "vaihingen"
        return load_vaihingen_tiles(folder, **kwargs)
    if key == "text":
        return load_text(train=train, **kwargs)
    raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(KNOWN_DATASETS)}")
