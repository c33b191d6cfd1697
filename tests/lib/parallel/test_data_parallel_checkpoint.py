"""Checkpoint and resume of data-parallel runs on real engines (gloo, 2 local engines).

The contract (``course_lib.checkpoint``): rank 0 alone writes one file per position holding
every rank's state; a run resumed on the same world size equals the uninterrupted one bit for
bit (after an epoch and mid-epoch); on another world size it resumes only at an epoch boundary,
from rank 0's weights, and then equals one process resumed from the same file.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from course_lib.checkpoint import (
    CheckpointConfig,
    CheckpointError,
    checkpoint_files,
    load_checkpoint,
)
from course_lib.data.digits import load_digits
from course_lib.parallel.data_parallel.replica import GlobalBatchSampler
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.training.loop import TrainConfig, fit, seed_everything
from course_lib.training.models import MLP

pytestmark = pytest.mark.timeout(600)

CONFIG = TrainConfig(num_epochs=2, batch_size=48, lr=0.3, momentum=0.5, seed=3)


def small_digits() -> TensorDataset:
    """The first 240 training digits: 5 global batches of 48 per epoch."""
    X, y = load_digits().tensors
    return TensorDataset(X[:240], y[:240])


def _run(cluster, config=CONFIG, n=2, method="ring", **kwargs):
    return train_data_parallel(
        cluster,
        model="mlp",
        dataset=small_digits,
        config=config,
        method=method,
        world_size=n,
        comm_timeout=30,
        timeout=300,
        **kwargs,
    )


def _epochs(result, rank=0) -> list[dict]:
    return [
        {k: v for k, v in e.items() if k != "epoch_time"} for e in result.histories[rank].epochs
    ]


def _equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def cluster(shared_engines):
    return shared_engines(2)  # from the session's pool (tests/conftest.py)


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """The uninterrupted 2-epoch run (saving every 2 steps, all kept) and one stopped after 1."""
    root = tmp_path_factory.mktemp("dp_ckpt")
    full = _run(cluster, checkpoint=CheckpointConfig(root / "full", every_steps=2, keep=10))
    stopped = _run(
        cluster,
        TrainConfig(**{**CONFIG.__dict__, "num_epochs": 1}),
        checkpoint=CheckpointConfig(root / "stopped", every_steps=2),
    )
    return {"root": root, "full": full, "stopped": stopped}


def test_rank_0_writes_one_file_per_position_holding_every_rank(runs):
    root = runs["root"]
    names = [p.name for p in checkpoint_files(root / "full")]
    assert names == [
        "epoch0000-step000002.ckpt",
        "epoch0000-step000004.ckpt",
        "epoch0001-step000000.ckpt",
        "epoch0001-step000002.ckpt",
        "epoch0001-step000004.ckpt",
        "epoch0002-step000000.ckpt",
    ]
    assert not [p for p in (root / "full").iterdir() if p.name.startswith(".")]  # no leftovers
    # keep=2 (the default): the stopped run's folder holds its last two positions only.
    assert [p.name for p in checkpoint_files(root / "stopped")] == [
        "epoch0000-step000004.ckpt",
        "epoch0001-step000000.ckpt",
    ]
    ckpt = load_checkpoint(root / "full" / "epoch0001-step000002.ckpt", world_size=2)
    assert ckpt["world_size"] == 2 and ckpt["steps_done"] == 2
    assert [s["sampler"]["rank"] for s in ckpt["ranks"]] == [0, 1]
    assert [s["seen"] for s in ckpt["ranks"]] == [48, 48]  # 2 steps of 24 samples on each rank
    last = load_checkpoint(root / "full", world_size=2)
    saved = {k: v.numpy() for k, v in last["model"].items()}
    assert _equal(saved, runs["full"].weights)  # rank 0's replica, the run's final weights


def test_resume_after_an_epoch_equals_the_uninterrupted_run(cluster, runs):
    root = runs["root"]
    resumed = _run(cluster, resume_from=root / "stopped", checkpoint=root / "stopped")
    assert resumed.replicas_equal
    assert _equal(resumed.weights, runs["full"].weights)
    for rank in (0, 1):  # train metrics are each rank's own shard's: each rank kept its own
        assert _epochs(resumed, rank) == _epochs(runs["full"], rank)
    assert {r["epoch"] for r in resumed.records} == {2}  # 5 steps of epoch 2 on each rank
    assert len(resumed.records) == 2 * 5
    assert checkpoint_files(root / "stopped")[-1].name == "epoch0002-step000000.ckpt"


def test_resume_mid_epoch_equals_the_uninterrupted_run(cluster, runs):
    mid = runs["root"] / "full" / "epoch0001-step000002.ckpt"
    resumed = _run(cluster, resume_from=mid, method="bucketed", bucket_bytes=4096)
    assert _equal(resumed.weights, runs["full"].weights)
    assert _epochs(resumed, 1) == _epochs(runs["full"], 1)
    assert len(resumed.records) == 2 * 3  # the 3 steps left of epoch 2 on each rank


def test_another_world_size_resumes_at_an_epoch_boundary_only(cluster, runs):
    root = runs["root"]
    boundary = root / "full" / "epoch0001-step000000.ckpt"
    saved = {k: v.numpy() for k, v in load_checkpoint(boundary)["model"].items()}
    start = _run(
        cluster, TrainConfig(**{**CONFIG.__dict__, "num_epochs": 1}), n=1, resume_from=boundary
    )
    assert _equal(start.weights, saved)  # nothing left to train: rank 0's saved weights
    one = _run(cluster, n=1, resume_from=boundary)
    # The reference: one process resumed from the same file, on the whole global batch.
    seed_everything(99)
    net, data = MLP(), small_digits()
    sampler = GlobalBatchSampler(len(data), 0, 1, CONFIG.batch_size, seed=CONFIG.seed)
    # With the engine's thread count: it fixes the summation order inside torch's matmuls.
    threads, mine = (
        cluster.client[cluster.ids_by_rank[0]].apply_sync(torch.get_num_threads),
        torch.get_num_threads(),
    )
    torch.set_num_threads(threads)
    try:
        fit(net, data, CONFIG, sampler=sampler, progress=False, device="cpu", resume_from=boundary)
    finally:
        torch.set_num_threads(mine)
    reference = {k: p.detach().numpy() for k, p in net.named_parameters()}
    assert _equal(one.weights, reference)
    assert not _equal(one.weights, saved)  # it trained on
    # Equal to the 2-rank run up to summation order (see tests/lib/parallel/test_data_parallel.py's tolerance).
    for name, w in runs["full"].weights.items():
        np.testing.assert_allclose(one.weights[name], w, atol=2e-5, rtol=1e-4)
    mid = root / "full" / "epoch0001-step000002.ckpt"
    with pytest.raises(
        CheckpointError,
        match=r"saved by 2 rank\(s\) in the middle of epoch 2; "
        r"resuming on 1 is defined only at an epoch boundary",
    ):
        _run(cluster, n=1, resume_from=mid)


def test_a_corrupt_checkpoint_is_a_clear_error_naming_it(cluster, runs, tmp_path):
    bad = tmp_path / "epoch0001-step000000.ckpt"
    shutil.copy(runs["root"] / "full" / bad.name, bad)
    data = bytearray(bad.read_bytes())
    data[-100] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"checkpoint {bad} is corrupt.*SHA-256"):
        _run(cluster, resume_from=tmp_path)


@pytest.mark.parametrize("method", ["local_sgd", "compressed", "ddp"])
def test_methods_with_state_outside_the_weights_are_refused(cluster, tmp_path, method):
    with pytest.raises(ValueError, match=rf"method '{method}' cannot be checkpointed: .*ring"):
        _run(cluster, method=method, checkpoint=tmp_path)
    assert not list(tmp_path.iterdir())
