"""Checkpoint and resume: the whole training state, written atomically, restored bit for bit.

A checkpoint holds what the next step depends on: the weights, the optimiser's state (momentum
buffers, Adam's moments and step count), every random stream (Python ``random``, NumPy's global
generator, torch's CPU and CUDA generators, the DataLoader's ``torch.Generator``), the position
(epochs done, steps into the next epoch, and that epoch's running loss), the sampler's state and
the :class:`~course_lib.training.History` so far. ``fit(..., checkpoint=folder)`` writes one
after every epoch (and every ``every_steps`` steps); ``fit(..., resume_from=folder_or_file)``
continues so that the weights equal the uninterrupted run's (``torch.equal``) and so does the
history, wall times aside.

**Atomic.** A save writes a temporary file in the checkpoint's folder, flushes and fsyncs it,
renames it into place with ``os.replace`` and fsyncs the folder: the name points at the old
state or the complete new one, never at half a file, also when the process is killed or the
machine loses power mid-save. Write-then-rename alone is atomic; the folder also keeps the last
``keep`` (2) checkpoints, because a checkpoint can be complete and still unusable — copied
halfway to another lab PC, or, in data parallelism, written while another rank was dying — and
then the previous one is there to resume from. A temporary file left by a killed save starts
with ``.`` and ends ``.partial``; readers ignore it and the next save removes it. Files are
checked on load (a header with the payload's length and SHA-256), so a truncated or corrupt
file, or one from another model or world size, is a :class:`CheckpointError` naming the file
and the fix; loading uses ``torch.load(weights_only=True)``, so a file cannot run code.

**Data parallelism (the contract for a multi-rank loop).** One file per position, written by
rank 0 only: its replica (every replica is equal after each step), the optimiser state, the
history, and ``ranks``, the list of every rank's :func:`rank_state` (its random streams, its
sampler and its running loss), gathered to rank 0. On resume every rank reads the same file,
checks it with ``load_checkpoint(path, net=net, world_size=N)``, loads weights and optimiser
state and calls ``restore_rank_state(ckpt["ranks"][rank], generator, sampler)``.

- Same world size: defined anywhere, mid-epoch included; the result is bit for bit the
  uninterrupted run's.
- Different world size: defined only at an epoch boundary (``steps_done == 0``;
  ``load_checkpoint`` refuses otherwise). Weights, optimiser state, epoch and history carry over;
  each rank builds a fresh ``ShardSampler(n, rank, new_world_size, seed=...)`` (its permutation
  depends only on the seed and the epoch) and re-seeds its streams as at a fresh start, since
  rank 3 of 4 has no state in a run of 2. Keeping the *global* batch fixed (per-rank batch =
  global / world size), step t of an epoch averages gradients over the same samples,
  ``perm[t*B:(t+1)*B]``, just split differently: the run equals the uninterrupted one up to
  floating-point summation order (not bit for bit), for models that draw no random numbers while
  training (no dropout; none of the course's models does).
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "CheckpointConfig",
    "CheckpointError",
    "checkpoint_files",
    "latest_checkpoint",
    "load_checkpoint",
    "make_checkpoint",
    "rank_state",
    "restore_rank_state",
    "restore_streams",
    "restore_training_state",
    "resume_run",
    "save_run",
    "skip_done_steps",
    "save_checkpoint",
]

FORMAT = 1
MAGIC = b"COURSE_LIB_CKPT\n"
HEADER = struct.Struct(">16sQ32s")  # magic, payload length, payload SHA-256
NAME = re.compile(r"^epoch(\d{4})-step(\d{6})\.ckpt$")
#: Settings that must match for a resumed run to continue the same run (num_epochs may grow).
SAME_SETTINGS = ("lr", "batch_size", "momentum", "optimizer", "seed")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here; the message names the file and the fix."""


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often ``fit`` saves; invalid values raise ValueError on creation."""

    folder: str | os.PathLike
    #: Also save every this many steps inside an epoch (None: only after each epoch).
    every_steps: int | None = None
    #: Checkpoints kept in ``folder``, newest first; older ones are deleted after a save.
    keep: int = 2

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_steps < 1:
            raise ValueError(f"every_steps must be at least 1 or None, got {self.every_steps}")
        if self.keep < 1:
            raise ValueError(
                f"keep must be at least 1 (2 keeps one to fall back on), got {self.keep}"
            )

    @classmethod
    def of(cls, where: CheckpointConfig | str | os.PathLike | None) -> CheckpointConfig | None:
        """Return ``where`` as a CheckpointConfig (a folder gets the defaults); None stays None."""
        return cls(where) if isinstance(where, (str, os.PathLike)) else where

    def due(self, step: int, steps_in_epoch: int) -> bool:
        """Return whether to save after ``step`` of an epoch (its last step: the epoch saves)."""
        return bool(self.every_steps) and step % self.every_steps == 0 and step < steps_in_epoch


def rank_state(
    generator: torch.Generator,
    sampler: Any = None,
    *,
    seen: int = 0,
    total_loss: float = 0.0,
) -> dict[str, Any]:
    """Return this process's random streams, sampler state and running loss (nothing modified).

    ``generator`` is the DataLoader's; pass its state at the start of the current epoch when
    saving mid-epoch (a resumed run replays the epoch's order from it and skips the done steps).
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    sampler_state = (
        sampler.state_dict() if hasattr(sampler, "state_dict") else {"type": type(sampler).__name__}
    )
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "loader": generator.get_state() if isinstance(generator, torch.Generator) else generator,
        "sampler": sampler_state,
        "seen": seen,
        "total_loss": total_loss,
    }


def restore_streams(state: dict[str, Any]) -> None:
    """Set the global random streams (Python, NumPy, torch CPU and CUDA) to ``state``."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_rank_state(state: dict[str, Any], generator: torch.Generator, sampler: Any) -> None:
    """Set every random stream, ``generator`` and ``sampler`` to ``state`` (from rank_state)."""
    if hasattr(sampler, "load_state_dict"):
        try:
            sampler.load_state_dict(state["sampler"])  # raises on another world size or shard
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
    elif state["sampler"].get("type") != type(sampler).__name__:
        raise CheckpointError(
            f"the checkpoint was saved with sampler {state['sampler'].get('type')}, this run "
            f"uses {type(sampler).__name__}: resume with the same sampler"
        )
    restore_streams(state)
    generator.set_state(state["loader"])


def make_checkpoint(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    history: Any,
    *,
    epochs_done: int,
    steps_done: int,
    ranks: list[dict[str, Any]],
) -> dict[str, Any]:
    """Return the checkpoint of a run after ``epochs_done`` epochs and ``steps_done`` more steps."""
    return {
        "format": FORMAT,
        "epochs_done": epochs_done,
        "steps_done": steps_done,
        "world_size": len(ranks),
        "model": {k: v.detach().cpu().clone() for k, v in net.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "config": {name: getattr(config, name) for name in SAME_SETTINGS},
        "history": {"epochs": list(history.epochs), "step_times": list(history.step_times)},
        "ranks": ranks,
    }


def save_run(
    where: CheckpointConfig | str | os.PathLike,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    history: Any,
    *,
    epochs_done: int,
    steps_done: int,
    loader: torch.Generator | torch.Tensor,
    sampler: Any,
    seen: int = 0,
    total_loss: float = 0.0,
) -> Path:
    """Save a one-process run (fit's checkpoint); ``loader``: the generator at the epoch's start."""
    ranks = [rank_state(loader, sampler, seen=seen, total_loss=total_loss)]
    checkpoint = make_checkpoint(net, optimizer, config, history, epochs_done=epochs_done,
                                 steps_done=steps_done, ranks=ranks)  # fmt: skip
    return save_checkpoint(where, checkpoint)


def checkpoint_files(folder: str | os.PathLike) -> list[Path]:
    """Return the checkpoints in ``folder``, oldest first (temporary files left out)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if NAME.match(p.name))


def latest_checkpoint(folder: str | os.PathLike) -> Path | None:
    """Return the newest checkpoint in ``folder``, or None when there is none."""
    files = checkpoint_files(folder)
    return files[-1] if files else None


def _write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, os.replace, fsync the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(tmp, "wb") as handle:
        _write_all(handle, data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    # The rename lives in the folder's entry: without this fsync a power cut can undo it.
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _write_all(handle: io.BufferedWriter, data: bytes, chunk: int = 1 << 20) -> None:
    """Write ``data`` in 1 MiB pieces (a large checkpoint is several writes, as on disk)."""
    view = memoryview(data)
    for start in range(0, len(view), chunk):
        handle.write(view[start : start + chunk])


def save_checkpoint(
    where: CheckpointConfig | str | os.PathLike, checkpoint: dict[str, Any]
) -> Path:
    """Write ``checkpoint`` atomically into a folder, keep the newest ``keep``; return its path.

    One writer per folder (rank 0 in data parallelism): it removes stale temporary files.
    """
    config = where if isinstance(where, CheckpointConfig) else CheckpointConfig(where)
    folder = Path(config.folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".*.partial"):  # left by a save that was killed
        stale.unlink(missing_ok=True)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    payload = buffer.getvalue()
    header = HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())
    path = folder / f"epoch{checkpoint['epochs_done']:04d}-step{checkpoint['steps_done']:06d}.ckpt"
    _write_durably(path, header + payload)
    for old in checkpoint_files(folder)[: -config.keep]:
        old.unlink(missing_ok=True)
    return path


def _others(path: Path) -> str:
    others = [p.name for p in checkpoint_files(path.parent) if p != path]
    return (
        f"resume from an earlier one in {path.parent} ({', '.join(others)})"
        if others
        else ("no other checkpoint is in that folder: start the run again")
    )


def _read_verified(path: Path) -> dict[str, Any]:
    """Return the checkpoint stored in ``path`` after checking its header, length and hash."""
    data = path.read_bytes()
    if len(data) < HEADER.size or not data.startswith(MAGIC):
        if len(data) < HEADER.size and MAGIC.startswith(data[: len(MAGIC)]):
            raise CheckpointError(
                f"checkpoint {path} is truncated ({len(data)} bytes); {_others(path)}"
            )
        raise CheckpointError(
            f"{path} is not a course_lib checkpoint (no header): pass a file written by "
            f"save_checkpoint / fit(checkpoint=...), or its folder"
        )
    _, length, digest = HEADER.unpack_from(data)
    payload = data[HEADER.size :]
    if len(payload) != length:
        raise CheckpointError(
            f"checkpoint {path} is truncated: {len(payload)} of {length} bytes (an interrupted "
            f"copy or a full disk); {_others(path)}"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its contents do not match their SHA-256 (a damaged "
            f"disk or copy); {_others(path)}"
        )
    return torch.load(io.BytesIO(payload), weights_only=True)


def _check_model(path: Path, saved: dict[str, torch.Tensor], net: nn.Module) -> None:
    here = net.state_dict()
    missing, extra = sorted(set(saved) - set(here)), sorted(set(here) - set(saved))
    if missing or extra:
        raise CheckpointError(
            f"checkpoint {path} was saved from a different model: parameters only in the "
            f"checkpoint {missing}, only in this model {extra}; build the model the checkpoint "
            f"was saved from (same class and settings) before resuming"
        )
    for name, tensor in saved.items():
        if tuple(tensor.shape) != tuple(here[name].shape):
            raise CheckpointError(
                f"checkpoint {path} was saved from a different model: parameter {name!r} has "
                f"shape {tuple(tensor.shape)} there and {tuple(here[name].shape)} here; build "
                f"the model the checkpoint was saved from (same class and settings)"
            )


def load_checkpoint(
    path: str | os.PathLike, *, net: nn.Module | None = None, world_size: int = 1
) -> dict[str, Any]:
    """Read and check a checkpoint (a file, or a folder: its newest); raise CheckpointError.

    With ``net``, its parameter names and shapes must match; ``world_size`` is the number of
    processes that will resume (another one is allowed only at an epoch boundary).
    """
    path = Path(path)
    if path.is_dir():
        newest = latest_checkpoint(path)
        if newest is None:
            raise CheckpointError(
                f"no checkpoint in {path}: train with fit(..., checkpoint={str(path)!r}) first, "
                f"or leave out resume_from"
            )
        path = newest
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file {path}: check the path (or pass its folder)")
    ckpt = _read_verified(path)
    if ckpt.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {ckpt.get('format')}, this kit reads format "
            f"{FORMAT}: resume with the kit version that wrote it"
        )
    if net is not None:
        _check_model(path, ckpt["model"], net)
    if ckpt["world_size"] != world_size and ckpt["steps_done"] != 0:
        raise CheckpointError(
            f"checkpoint {path} was saved by {ckpt['world_size']} rank(s) in the middle of epoch "
            f"{ckpt['epochs_done'] + 1}; resuming on {world_size} is defined only at an epoch "
            f"boundary: resume on {ckpt['world_size']} rank(s), or from an end-of-epoch "
            f"checkpoint (a file named ...-step000000.ckpt)"
        )
    ckpt["path"] = str(path)
    return ckpt


def restore_training_state(
    ckpt: dict[str, Any], net: nn.Module, optimizer: torch.optim.Optimizer, config: Any
) -> None:
    """Load weights and optimiser state from ``ckpt`` after checking the run's settings match."""
    differ = [
        f"{name}={ckpt['config'][name]!r} there, {getattr(config, name)!r} here"
        for name in SAME_SETTINGS
        if ckpt["config"][name] != getattr(config, name)
    ]
    if differ:
        raise CheckpointError(
            f"checkpoint {ckpt['path']} belongs to a run with other settings ({'; '.join(differ)})"
            f": resume with the same TrainConfig (only num_epochs and target may change)"
        )
    with torch.no_grad():
        net.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])


def resume_run(
    resume_from: str | os.PathLike,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    generator: torch.Generator,
    sampler: Any,
    history: Any,
) -> dict[str, Any]:
    """Restore a one-process run from ``resume_from`` in place (fit's resume); return the checkpoint."""
    ckpt = load_checkpoint(resume_from, net=net, world_size=1)
    restore_training_state(ckpt, net, optimizer, config)
    history.epochs[:] = ckpt["history"]["epochs"]
    history.step_times[:] = ckpt["history"]["step_times"]
    restore_rank_state(ckpt["ranks"][0], generator, sampler)
    return ckpt


def skip_done_steps(batches: Any, ckpt: dict[str, Any], rank: int = 0) -> tuple[int, int, float]:
    """Consume the batches a mid-epoch checkpoint had trained on; return (steps, seen, loss sum).

    ``batches`` is the epoch's fresh DataLoader iterator, made after :func:`restore_rank_state`
    set the loader's generator to the epoch's start, so it yields the same order as before.
    """
    state = ckpt["ranks"][rank]
    for _ in range(ckpt["steps_done"]):
        next(batches)
    restore_streams(state)  # loading the skipped batches may have drawn random numbers
    return ckpt["steps_done"], state["seen"], state["total_loss"]
