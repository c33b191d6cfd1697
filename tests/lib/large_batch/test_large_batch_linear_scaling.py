"""Lecture 12's separated linear-scaling experiment: batches cut from a stream of epochs drop no
image, the warm-up is the library's schedule in steps, and a divergent run says so."""

from __future__ import annotations

import torch

from course_lib.parallel.large_batch.linear_scaling import (
    accuracy_after_steps,
    batches_without_dropping,
)


def test_batches_from_a_stream_of_epochs_use_every_image_once_an_epoch():
    # 1500 // 1024 would keep 1024 images an epoch; the stream keeps all 1500
    batches = batches_without_dropping(1500, 1024, 3, torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [1024] * 3
    stream = torch.cat(batches)
    assert sorted(stream[:1500].tolist()) == list(range(1500))  # the first epoch, whole
    assert sorted(stream[1500:3000].tolist()) == list(range(1500))  # the second, whole too


def test_a_fixed_step_budget_trains_and_a_runaway_rate_is_reported():
    acc = accuracy_after_steps(512, base_lr=0.05, steps=30, warmup_steps=5, seed=0)
    assert acc is not None and acc > 0.5
    assert accuracy_after_steps(512, base_lr=0.05, steps=30, warmup_steps=5, seed=0) == acc
    capped = accuracy_after_steps(512, base_lr=0.05, steps=30, warmup_steps=5, seed=0, max_lr=1e-9)
    assert capped is not None and capped < 0.3  # the cap is applied: it barely moves
    assert accuracy_after_steps(512, base_lr=1e6, steps=5, warmup_steps=0, seed=0) is None
