"""Checkpoint and resume: a resumed run equals the uninterrupted one bit for bit; saves are atomic.

Each resume test trains once without checkpoints (the reference), once with a checkpoint after
every epoch and every few steps (which must not change the run), then resumes from checkpoints
at an epoch boundary and mid-epoch into a freshly initialised model with scrambled random
streams: weights ``torch.equal`` and the histories equal except their wall times.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, Subset

from course_lib.checkpoint import (
    CheckpointConfig,
    CheckpointError,
    checkpoint_files,
    latest_checkpoint,
    load_checkpoint,
    rank_state_for,
    save_checkpoint,
)
from course_lib.data import ShardSampler, load_dataset
from course_lib.training.batch_schedules import BatchRampUp
from course_lib.training.loop import TrainConfig, fit, seed_everything
from course_lib.training.models import MLP

ROOT = Path(__file__).resolve().parents[3]
NUM_SAMPLES = 360  # with batch 40: 9 steps per epoch


@pytest.fixture(scope="module")
def train_set():
    return Subset(load_dataset("digits"), range(NUM_SAMPLES))


class Augmented(Dataset):
    """``base`` with Gaussian noise drawn from torch's global generator on every access."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        X, y = self.base[i]
        return X + 0.1 * torch.randn(X.shape), y


def _without_wall_times(history) -> tuple[list[dict], int]:
    epochs = [{k: v for k, v in e.items() if k != "epoch_time"} for e in history.epochs]
    return epochs, len(history.step_times)


def _same_weights(net, ref_net) -> bool:
    """Return whether two models' tensors are equal bit for bit (names and values)."""
    a, b = net.state_dict(), ref_net.state_dict()
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def _run(train_set, config, *, sampler_args=None, **kwargs):
    """Train a fresh MLP seeded 0 (unless resuming) and return (net, history)."""
    seed_everything(0)
    net = MLP()
    sampler = ShardSampler(NUM_SAMPLES, **sampler_args) if sampler_args else None
    if "resume_from" in kwargs:  # a resumed run must not depend on its own start
        seed_everything(1234)
        net = MLP()
    history = fit(net, train_set, config, sampler=sampler, progress=False, **kwargs)
    return net, history


@pytest.mark.parametrize(
    ("settings", "sampler_args", "augmented"),
    [
        (dict(optimizer="sgd", momentum=0.9, lr=0.05), None, False),
        (dict(optimizer="adam", lr=0.003), None, False),
        (dict(optimizer="sgd", momentum=0.5, lr=0.05), dict(rank=1, world_size=3, seed=7), False),
        (dict(optimizer="adam", lr=0.003), dict(rank=0, world_size=3, seed=7), True),
    ],
    ids=["sgd-momentum", "adam", "shard-sampler", "augmented-shard-sampler"],
)
def test_resume_equals_the_uninterrupted_run(
    train_set, tmp_path, settings, sampler_args, augmented
):
    if augmented:  # data loading draws random numbers too: skipping done steps must not shift them
        train_set = Augmented(train_set)
    batch = 40 if sampler_args is None else 15  # a third of the set: 8 steps per epoch
    config = TrainConfig(num_epochs=3, batch_size=batch, seed=3, **settings)
    ref_net, ref_history = _run(train_set, config, sampler_args=sampler_args)
    saving = CheckpointConfig(tmp_path, every_steps=4, keep=100)
    net, history = _run(train_set, config, sampler_args=sampler_args, checkpoint=saving)
    assert _same_weights(net, ref_net)
    names = [p.name for p in checkpoint_files(tmp_path)]
    assert "epoch0001-step000000.ckpt" in names and "epoch0001-step000004.ckpt" in names, names
    assert latest_checkpoint(tmp_path).name == "epoch0003-step000000.ckpt"
    # After epoch 1 (the boundary), and four steps into epoch 2 (mid-epoch).
    for name in ("epoch0001-step000000.ckpt", "epoch0001-step000004.ckpt"):
        net, history = _run(
            train_set, config, sampler_args=sampler_args, resume_from=tmp_path / name
        )
        assert _same_weights(net, ref_net), name
        assert _without_wall_times(history) == _without_wall_times(ref_history), name


def test_resume_from_a_folder_takes_the_newest_and_can_extend_the_run(train_set, tmp_path):
    short = TrainConfig(num_epochs=1, batch_size=40, lr=0.05, momentum=0.9)
    _run(train_set, short, checkpoint=tmp_path)
    longer = TrainConfig(num_epochs=2, batch_size=40, lr=0.05, momentum=0.9)
    ref_net, _ = _run(train_set, longer)
    net, history = _run(train_set, longer, resume_from=tmp_path)
    assert [e["epoch"] for e in history.epochs] == [1, 2]
    assert _same_weights(net, ref_net)


@pytest.fixture
def two_checkpoints(train_set, tmp_path) -> list[Path]:
    _run(train_set, TrainConfig(num_epochs=2, batch_size=40), checkpoint=tmp_path)
    files = checkpoint_files(tmp_path)
    assert [p.name for p in files] == ["epoch0001-step000000.ckpt", "epoch0002-step000000.ckpt"]
    return files


def test_only_the_last_two_checkpoints_are_kept(train_set, tmp_path):
    _run(train_set, TrainConfig(num_epochs=3, batch_size=40), checkpoint=tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["epoch0002-step000000.ckpt", "epoch0003-step000000.ckpt"]
    # A run resumed from epoch 2 saves four steps into epoch 3: the old epoch 3 is superseded.
    ckpt = load_checkpoint(tmp_path / names[0])
    save_checkpoint(CheckpointConfig(tmp_path, keep=3), {**ckpt, "steps_done": 4})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["epoch0002-step000000.ckpt", "epoch0002-step000004.ckpt"]


def test_truncated_checkpoint_is_a_clear_error(two_checkpoints):
    newest = two_checkpoints[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        CheckpointError, match=r"is truncated: \d+ of \d+ bytes.*epoch0001-step000000\.ckpt"
    ) as err:
        load_checkpoint(newest.parent)
    assert str(newest) in str(err.value)
    newest.write_bytes(data[:20])  # not even a whole header
    with pytest.raises(CheckpointError, match=r"\.ckpt is truncated \(20 bytes\)"):
        load_checkpoint(newest)


def test_corrupt_checkpoint_is_a_clear_error(two_checkpoints):
    newest = two_checkpoints[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the weights
    newest.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"corrupt.*SHA-256.*epoch0001") as err:
        load_checkpoint(newest)
    assert str(newest) in str(err.value)
    newest.write_bytes(b"hello, not a checkpoint at all" * 10)
    with pytest.raises(CheckpointError, match="not a course_lib checkpoint"):
        load_checkpoint(newest)


def _flip(offset: int, bit: int = 0x01):
    """Return a damage that flips one bit of the byte at ``offset`` (negative: from the end)."""

    def damage(data: bytes) -> bytes:
        out = bytearray(data)
        out[offset] ^= bit
        return bytes(out)

    return damage


# The header: 16 bytes of magic, the contents' length (8 bytes, big-endian), their SHA-256.
DAMAGES = {
    "length field, top byte": (_flip(16), "corrupt: its header"),
    "length field, one less": (_flip(23), "corrupt: its header"),
    "length field, one more": (_flip(23, 0x02), "corrupt: its header"),
    "magic": (_flip(3), "corrupt: its header"),
    "digest": (_flip(40), "corrupt: its contents"),
    "cut in the contents": (lambda data: data[: len(data) // 2], "truncated: "),
    "cut in the header": (lambda data: data[:20], r"truncated \(20 bytes\)"),
}


@pytest.mark.parametrize("where", list(DAMAGES))
def test_a_damaged_header_is_corrupt_and_a_cut_file_truncated(two_checkpoints, where):
    damage, said = DAMAGES[where]
    newest = two_checkpoints[-1]
    newest.write_bytes(damage(newest.read_bytes()))
    with pytest.raises(CheckpointError, match=said) as err:
        load_checkpoint(newest)
    assert "epoch0001-step000000.ckpt" in str(err.value)  # the fix: the earlier checkpoint


def test_a_different_model_shape_is_a_clear_error_naming_the_parameter(two_checkpoints):
    with pytest.raises(
        CheckpointError,
        match=r"'1\.weight' has shape \(128, 64\) there and "
        r"\(32, 64\) here",
    ) as err:
        load_checkpoint(two_checkpoints[-1], net=MLP(hidden=(32,)))
    assert str(two_checkpoints[-1]) in str(err.value)
    with pytest.raises(CheckpointError, match=r"only in this model \['5\.bias', '5\.weight'\]"):
        load_checkpoint(two_checkpoints[-1], net=MLP(hidden=(128, 16)))


def test_other_settings_or_world_size_are_clear_errors(train_set, tmp_path):
    config = TrainConfig(num_epochs=1, batch_size=15, lr=0.05)
    shard = dict(rank=0, world_size=3, seed=7)
    _run(train_set, config, sampler_args=shard, checkpoint=CheckpointConfig(tmp_path, 4))
    boundary = tmp_path / "epoch0001-step000000.ckpt"
    with pytest.raises(CheckpointError, match=r"batch_size=15 there, 40 here"):
        _run(train_set, TrainConfig(num_epochs=2, batch_size=40, lr=0.05), resume_from=boundary)
    ramped = TrainConfig(
        num_epochs=2, batch_size=15, lr=0.05, batch_schedule=BatchRampUp(milestones=(2,))
    )  # the same weights, but other steps from here on: another run
    with pytest.raises(CheckpointError, match=r"batch_schedule=None there, 'BatchRampUp\(.*here"):
        _run(train_set, ramped, resume_from=boundary, sampler_args=shard)
    with pytest.raises(CheckpointError, match=r"world_size=3 there, 2 here.*ShardSampler"):
        _run(
            train_set,
            TrainConfig(num_epochs=2, batch_size=15, lr=0.05),
            resume_from=boundary,
            sampler_args=dict(rank=0, world_size=2, seed=7),
        )
    mid = tmp_path / "epoch0000-step000004.ckpt"
    with pytest.raises(
        CheckpointError,
        match=r"saved by 1 rank\(s\) in the middle of epoch 1; "
        r"resuming on 2 is defined only at an epoch boundary",
    ):
        load_checkpoint(mid, world_size=2)
    ckpt = load_checkpoint(boundary, world_size=2)  # an epoch boundary: allowed
    assert rank_state_for(ckpt, 1, 2) is None  # no saved streams for a new world size
    assert rank_state_for(ckpt, 0, 1)["sampler"]["world_size"] == 3


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_a_global_batch_holds_the_same_samples_on_any_world_size(world_size):
    # Why resuming at an epoch boundary on another world size continues the same run (up to
    # summation order): step t of every rank together covers perm[t*B:(t+1)*B].
    global_batch, n = 24, 96
    steps = [set() for _ in range(n // global_batch)]
    for rank in range(world_size):
        sampler = ShardSampler(n, rank, world_size, seed=5, even=True)
        sampler.set_epoch(2)
        order = list(sampler)
        per_rank = global_batch // world_size
        for t, step in enumerate(steps):
            step.update(order[t * per_rank : (t + 1) * per_rank])
    single = ShardSampler(n, 0, 1, seed=5)
    single.set_epoch(2)
    order = list(single)
    assert steps == [set(order[t * global_batch : (t + 1) * global_batch]) for t in range(4)]


KILLED_SAVE = """
import os, sys, time
import torch
from course_lib import checkpoint
from course_lib import files  # the one atomic writer
from course_lib.training.models import MLP
from course_lib.training.loop import History, TrainConfig

folder, where = sys.argv[1], sys.argv[2]
net = MLP()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
def save(epochs_done, net):
    checkpoint.save_run(folder, net, opt, TrainConfig(), History(), epochs_done=epochs_done,
                        steps_done=0, loader=torch.Generator(), sampler=None)
save(1, net)

def stop_here(*args):
    print("STOPPED", flush=True)  # the test kills this process now
    time.sleep(600)

if where == "mid-write":  # half of the file is on disk
    real = files._write_all
    def half(handle, data, chunk=1 << 20):
        real(handle, data[: len(data) // 2])
        handle.flush()
        stop_here()
    files._write_all = half
else:  # written and fsynced, not yet renamed
    os.replace = stop_here
big = MLP(hidden=(2048, 2048))  # about 17 MB of float32 weights: many writes
save(2, big)
"""


@pytest.mark.parametrize("where", ["mid-write", "before-rename"])
def test_a_save_killed_mid_write_leaves_the_previous_checkpoint(tmp_path, where):
    script = tmp_path / "killed_save.py"
    script.write_text(textwrap.dedent(KILLED_SAVE))
    folder = tmp_path / "ckpt"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), str(folder), where],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the writer reaches the kill point
        assert line.strip() == "STOPPED", proc.stderr.read()
        partial = [p for p in folder.iterdir() if p.name.endswith(".partial")]
        assert len(partial) == 1 and partial[0].stat().st_size > 1_000_000, partial
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The previous checkpoint is intact and is what the folder resumes from.
    assert [p.name for p in checkpoint_files(folder)] == ["epoch0001-step000000.ckpt"]
    ckpt = load_checkpoint(folder, net=MLP())
    assert ckpt["epochs_done"] == 1
    # The stray temporary file neither breaks loading nor survives the next save.
    save_checkpoint(folder, {**ckpt, "epochs_done": 2})
    assert sorted(p.name for p in folder.iterdir()) == [
        "epoch0001-step000000.ckpt",
        "epoch0002-step000000.ckpt",
    ]
