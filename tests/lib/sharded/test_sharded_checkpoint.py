"""Checkpoint and resume of sharded runs (ZeRO stages 1-3) on 3 real engines (and 2 and 4).

Each rank keeps only its shard of Adam's state (stage 3: of the weights too), so a checkpoint keeps
the whole weights (rank 0's after the allgather; stage 3: gathered for the file) and every rank's
shards; a run resumed on the same world size and
stage equals the uninterrupted one bit for bit, mid-epoch too. The MLP's 9 610 values do not
split evenly over 3 ranks (uneven shards). Resuming on another world size, another stage or a
method that does not shard is refused before any engine is busy, naming what to run instead.
On 2 and 4 engines (the MLP's values split evenly over 2, unevenly over 4) a resumed run equals
the uninterrupted one too; one epoch there, to stay fast.
"""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import TensorDataset

from course_lib.checkpoint import CheckpointConfig, CheckpointError, load_checkpoint
from course_lib.data.digits import load_digits
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.training.loop import TrainConfig

pytestmark = pytest.mark.timeout(600)

ADAM = TrainConfig(num_epochs=2, batch_size=48, lr=3e-3, optimizer="adam", seed=5)


def small_digits() -> TensorDataset:
    """The first 192 training digits: 4 global batches of 48 per epoch."""
    X, y = load_digits().tensors
    return TensorDataset(X[:192], y[:192])


def _run(cluster, method, n=3, config=ADAM, **kwargs):
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


def _equal(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def cluster(shared_engines):
    return shared_engines(4)  # from the session's pool (tests/conftest.py); runs name their N


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_sharded_run_resumed_mid_epoch_equals_the_uninterrupted_run(cluster, stage, tmp_path):
    full = _run(cluster, f"zero{stage}", checkpoint=CheckpointConfig(tmp_path, 2, keep=10))
    mid = tmp_path / "epoch0001-step000002.ckpt"
    ckpt = load_checkpoint(mid, world_size=3)
    assert ckpt["sharded"] == {"stage": stage, "world_size": 3} and ckpt["optimizer"] is None
    shards = [
        sum(state["exp_avg"].numel() for state in r["optimizer_shard"]["state"].values())
        for r in ckpt["ranks"]
    ]
    assert sum(shards) == 9610 and len(set(shards)) == 2  # each rank its own, uneven, shard
    last = load_checkpoint(tmp_path / "epoch0002-step000000.ckpt", world_size=3)["model"]
    assert _equal({k: v.numpy() for k, v in last.items()}, full.weights)  # the whole weights
    resumed = _run(cluster, f"zero{stage}", resume_from=mid)
    assert resumed.replicas_equal
    assert _equal(resumed.weights, full.weights)
    assert len(resumed.records) == 3 * 2  # the 2 steps left of epoch 2 on each rank

    # Bad input: refused before any engine trains, naming what to run instead.
    with pytest.raises(CheckpointError, match=rf"cut in 3 shards, this run is stage {stage} on 2"):
        _run(cluster, f"zero{stage}", n=2, resume_from=tmp_path / "epoch0001-step000000.ckpt")
    other = 2 if stage != 2 else 1
    with pytest.raises(CheckpointError, match=rf"resume with method='zero{stage}' on 3 ranks"):
        _run(cluster, f"zero{other}", resume_from=mid)
    with pytest.raises(CheckpointError, match=rf"ZeRO stage {stage} cut in 3 shards: resume"):
        _run(cluster, "ring", resume_from=mid)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_sharded_run_resumed_mid_epoch_equals_the_uninterrupted_run_on_2_and_4(
    cluster, stage, n, tmp_path
):
    one_epoch = TrainConfig(**{**ADAM.__dict__, "num_epochs": 1})
    full = _run(
        cluster,
        f"zero{stage}",
        n=n,
        config=one_epoch,
        checkpoint=CheckpointConfig(tmp_path, 2, keep=10),
    )
    mid = tmp_path / "epoch0000-step000002.ckpt"
    ckpt = load_checkpoint(mid, world_size=n)
    assert ckpt["sharded"] == {"stage": stage, "world_size": n}
    shards = [
        sum(state["exp_avg"].numel() for state in r["optimizer_shard"]["state"].values())
        for r in ckpt["ranks"]
    ]
    assert sum(shards) == 9610 and len(shards) == n
    resumed = _run(cluster, f"zero{stage}", n=n, config=one_epoch, resume_from=mid)
    assert resumed.replicas_equal
    assert _equal(resumed.weights, full.weights)
    assert len(resumed.records) == n * 2  # the 2 steps left of the epoch on each rank


def test_a_whole_optimiser_state_is_not_resumed_sharded(cluster, tmp_path):
    _run(
        cluster,
        "ring",
        config=TrainConfig(**{**ADAM.__dict__, "num_epochs": 1}),
        checkpoint=tmp_path,
    )
    with pytest.raises(CheckpointError, match=r"one whole optimiser state, this run shards it"):
        _run(cluster, "zero1", resume_from=tmp_path)
