"""Lectures 1 and 4: The checkpoint file: written atomically and durably, checked on load, the last few kept.

A file is a header (magic, payload length, payload SHA-256) and a ``torch.save`` payload. A save
goes through a temporary file in the same folder (fsync, ``os.replace``, fsync of the folder:
:func:`course_lib.files.atomic_write_bytes`);
see :mod:`course_lib.checkpoint` for why, and for what the payload holds.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from course_lib.files import PARTIAL_SUFFIX, atomic_write_bytes

__all__ = [
    "FORMAT",
    "CheckpointConfig",
    "CheckpointError",
    "checkpoint_files",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

FORMAT = 1
MAGIC = b"COURSE_LIB_CKPT\n"
HEADER = struct.Struct(">16sQ32s")  # magic, payload length, payload SHA-256
NAME = re.compile(r"^epoch(\d{4})-step(\d{6})\.ckpt$")


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


def save_checkpoint(
    where: CheckpointConfig | str | os.PathLike, checkpoint: dict[str, Any]
) -> Path:
    """Write ``checkpoint`` atomically into a folder, keep the newest ``keep``; return its path.

    One writer per folder (rank 0 in data parallelism): it removes stale temporary files.
    """
    config = where if isinstance(where, CheckpointConfig) else CheckpointConfig(where)
    folder = Path(config.folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f".*{PARTIAL_SUFFIX}"):  # left by a save that was killed
        stale.unlink(missing_ok=True)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    payload = buffer.getvalue()
    header = HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())
    path = folder / f"epoch{checkpoint['epochs_done']:04d}-step{checkpoint['steps_done']:06d}.ckpt"
    atomic_write_bytes(path, header + payload)
    # Later positions are from a run this one resumed from an earlier point: superseded.
    kept = [p for p in checkpoint_files(folder) if p.name <= path.name]
    for old in [p for p in checkpoint_files(folder) if p.name > path.name] + kept[: -config.keep]:
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
    """Return the checkpoint stored in ``path`` after checking its header, length and hash.

    A file cut short is *truncated* (an interrupted copy, a full disk); a file whose bytes were
    changed is *corrupt*. A damaged length field must not pass for a cut: a payload that still
    matches its SHA-256 is whole, so then the header is what was damaged.
    """
    data = path.read_bytes()
    if len(data) < HEADER.size:
        if MAGIC.startswith(data[: len(MAGIC)]):
            raise CheckpointError(
                f"checkpoint {path} is truncated ({len(data)} bytes); {_others(path)}"
            )
        raise _not_a_checkpoint(path)
    magic, length, digest = HEADER.unpack_from(data)
    payload = data[HEADER.size :]
    whole = hashlib.sha256(payload).digest() == digest
    if magic != MAGIC:
        # a few bytes off is a damaged header of ours; another kind of file shares almost none
        if not whole and sum(a == b for a, b in zip(magic, MAGIC, strict=True)) < len(MAGIC) // 2:
            raise _not_a_checkpoint(path)
        raise _corrupt_header(path, f"its first {len(MAGIC)} bytes are not {MAGIC!r}")
    if len(payload) != length and whole:
        raise _corrupt_header(
            path,
            f"it gives the contents' length as {length} bytes, but the {len(payload)} bytes "
            "after it are whole (they match the header's SHA-256)",
        )
    if len(payload) > length:
        what = f"it gives the contents' length as {length} bytes, but {len(payload)} follow it"
        raise _corrupt_header(path, what)
    if len(payload) < length:
        raise CheckpointError(
            f"checkpoint {path} is truncated: {len(payload)} of {length} bytes (an interrupted "
            f"copy or a full disk); {_others(path)}"
        )
    if not whole:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its contents do not match their SHA-256 (a damaged "
            f"disk or copy); {_others(path)}"
        )
    return torch.load(io.BytesIO(payload), weights_only=True)


def _corrupt_header(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is corrupt: its header is damaged ({what}; a damaged disk or copy, "
        f"not an interrupted save, which never leaves a partial file); {_others(path)}"
    )


def _not_a_checkpoint(path: Path) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a course_lib checkpoint (no header): pass a file written by "
        f"save_checkpoint / fit(checkpoint=...), or its folder"
    )


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
