"""Lectures 1 and 4: Write a file atomically and durably: a reader sees the old file or the new one, never half of one.

Every writer of the kit goes through here (datasets and caches, checkpoints, the grader's
gradebook and notebooks, the lab's roster): the data goes to a temporary file in the same
folder (``.NAME.XXXX.partial``), is fsynced, replaces the target with ``os.replace`` (atomic on
POSIX within one file system), and the folder is fsynced, since the rename lives in the folder's
entry. A failed write removes its temporary file and leaves the old content as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO

__all__ = ["PARTIAL_SUFFIX", "atomic_write_bytes", "atomic_write_text"]

#: The suffix of a write's temporary file (a killed writer's can be found and removed).
PARTIAL_SUFFIX = ".partial"


def atomic_write_bytes(path: str | os.PathLike, data: bytes, chunk: int = 1 << 20) -> Path:
    """Write ``data`` to ``path`` (its folder created) atomically and durably; return the path.

    The temporary file has a unique name, so two processes (two engines) writing the same
    file do not collide: the last rename wins. ``data`` goes out in ``chunk``-byte pieces.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            _write_all(handle, data, chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, say; a killed process leaves it to the next writer
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename lives in the folder's entry: without this fsync a power cut can undo it.
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return path


def _write_all(handle: BinaryIO, data: bytes, chunk: int = 1 << 20) -> None:
    """Write ``data`` in ``chunk``-byte pieces (a large file is several writes, as on disk)."""
    view = memoryview(data)
    for start in range(0, len(view), chunk):
        handle.write(view[start : start + chunk])


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` like :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))
