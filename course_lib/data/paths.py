"""Lecture 1: Where datasets live on disk, and how files are written there without leaving half a file."""

from __future__ import annotations

import os
from pathlib import Path

import course_lib

__all__ = ["ENV_VAR", "datasets_dir", "cache_dir"]

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
