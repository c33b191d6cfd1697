"""Lecture 1: Where datasets live on disk, and how files are written there without leaving half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import course_lib

__all__ = ["ENV_VAR", "datasets_dir", "cache_dir", "atomic_write_bytes"]

#: Environment variable that moves the whole datasets folder (e.g. to a shared lab drive).
ENV_VAR = "COURSE_DATASETS_DIR"


def datasets_dir(root: str | os.PathLike | None = None) -> Path:
    """Return the datasets folder: ``root`` if given, else ``$COURSE_DATASETS_DIR``, else the repo's."""
    if root is not None:
        return Path(root).expanduser().resolve()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser().resolve()
    # The repository's datasets/ sits beside the package: course_lib/../datasets.
    return Path(course_lib.__file__).resolve().parent.parent / "datasets"


def cache_dir(root: str | os.PathLike | None = None) -> Path:
    """Return the (git-ignored) cache folder inside :func:`datasets_dir`, creating it."""
    path = datasets_dir(root) / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``.

    A reader (or a second engine writing the same file) sees the old file or the new one,
    never a half-written one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
