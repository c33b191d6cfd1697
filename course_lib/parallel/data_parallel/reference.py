"""Lecture 4: The single-process reference of data parallelism: one process trained on the whole global batch.

A data-parallel run on N ranks with global batch B is correct when its weights equal those of
this run: rank 0's initial network (the same seed), the same global batches in the same order
(:class:`~course_lib.parallel.data_parallel.replica.GlobalBatchSampler` with one rank), one mean gradient over
all B samples per step. The two differ only by float32 rounding: the distributed mean sums N
means of B/N samples, the single process one mean of B (a few units in the last place per
step), so ``weights_match`` allows 2e-5 absolute + 1e-4 relative, as ``tests/lib/parallel/test_data_parallel.py``
justifies; source 000's published averaging misses by about 1e-2.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from course_lib.parallel.data_parallel.replica import GlobalBatchSampler
from course_lib.training.loop import TrainConfig, fit, seed_everything
from course_lib.training.models import build_model

__all__ = ["ATOL", "RTOL", "max_weight_difference", "train_one_process", "weights_match"]

ATOL, RTOL = 2e-5, 1e-4


def train_one_process(model: Any, dataset: Any, config: TrainConfig) -> dict[str, np.ndarray]:
    """Train rank 0's initial network here on whole global batches; return its weights by name.

    ``model`` and ``dataset`` are what :func:`train_data_parallel` takes: a model name, a
    function building the network (seeded like rank 0, with ``config.seed``), a data set or a
    function returning one.
    """
    seed_everything(config.seed)  # rank 0 seeds with seed + 0 before building its replica
    if isinstance(model, nn.Module):
        raise TypeError("pass a model name or a function building the network, not an instance")
    net = build_model(model) if isinstance(model, str) else model()
    data = dataset if isinstance(dataset, Dataset) else dataset()
    sampler = GlobalBatchSampler(len(data), 0, 1, config.batch_size, seed=config.seed)
    fit(net, data, config, sampler=sampler, progress=False, device="cpu")
    return {name: p.detach().numpy().copy() for name, p in net.named_parameters()}


def max_weight_difference(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    """Return the largest absolute difference between two sets of weights with the same names."""
    if set(got) != set(want):
        raise ValueError(f"different parameters: {sorted(set(got) ^ set(want))}")
    return max(float(np.abs(got[k] - want[k]).max(initial=0.0)) for k in want)


def weights_match(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    """Return True when every tensor agrees within ``ATOL`` + ``RTOL`` (float32 rounding only)."""
    return set(got) == set(want) and all(
        np.allclose(got[k], want[k], atol=ATOL, rtol=RTOL) for k in want
    )
