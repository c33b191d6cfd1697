"""Lecture 1: MNIST, Fashion-MNIST and CIFAR through torchvision, cached under ``datasets/cache``.

Offline, torchvision's download fails (``RuntimeError ... Name or service not known`` for MNIST,
``URLError`` for CIFAR) and leaves an empty ``raw/`` folder behind. We turn that into one
:class:`DatasetUnavailableError` that says which files to fetch and where to put them, and we
remove every file and folder the failed attempt created, so the next try starts clean.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from course_lib.data.paths import cache_dir

__all__ = ["TORCHVISION_SETS", "DatasetUnavailableError", "TorchvisionSet", "load_torchvision"]


class DatasetUnavailableError(RuntimeError):
    """A dataset is neither cached nor downloadable; the message says how to get it."""


@dataclass(frozen=True)
class TorchvisionSet:
    """How one torchvision dataset is fetched and where its files go inside the cache."""

    class_name: str  # attribute of torchvision.datasets
    folder: str  # folder under datasets/cache
    files_at: str  # where a user puts downloaded files, relative to that folder
    files: tuple[str, ...]
    url: str
    image_shape: tuple[int, int, int]
    num_classes: int


TORCHVISION_SETS: dict[str, TorchvisionSet] = {
    "mnist": TorchvisionSet(
        "MNIST", "mnist", "MNIST/raw",
        ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
        "https://ossci-datasets.s3.amazonaws.com/mnist/", (1, 28, 28), 10,
    ),
    "fashion_mnist": TorchvisionSet(
        "FashionMNIST", "fashion_mnist", "FashionMNIST/raw",
        ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", (1, 28, 28), 10,
    ),
    "cifar10": TorchvisionSet(
        "CIFAR10", "cifar10", ".", ("cifar-10-python.tar.gz",),
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", (3, 32, 32), 10,
    ),
    "cifar100": TorchvisionSet(
        "CIFAR100", "cifar100", ".", ("cifar-100-python.tar.gz",),
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", (3, 32, 32), 100,
    ),
}  # fmt: skip


def _snapshot(folder: Path) -> set[Path]:
    """Return every path under ``folder`` (and ``folder`` itself) that exists now."""
    if not folder.exists():
        return set()
    return {folder, *folder.rglob("*")}


def _remove_new(before: set[Path], folder: Path) -> None:
    """Delete what appeared under ``folder`` since ``before``: partial files, empty raw/ folders."""
    for path in sorted(_snapshot(folder) - before, key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _advice(name: str, spec: TorchvisionSet, folder: Path, error: BaseException) -> str:
    """Return the one message a student sees when a dataset cannot be had."""
    where = (folder / spec.files_at).resolve()
    files = "\n".join(f"    {where / f}" for f in spec.files)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or ["?"]
    reason = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return (
        f"Dataset {name!r} is not in the cache and could not be downloaded "
        f"({type(error).__name__}: {reason}).\n"
        f"To use it offline, download these files on a machine with internet access "
        f"(from {spec.url}) and put them here, unchanged (still compressed):\n{files}\n"
        f"Then run this cell again. To keep datasets elsewhere, set COURSE_DATASETS_DIR or pass "
        f"root=... . Without internet, load_dataset('digits') works everywhere."
    )


def _to_tensors(raw) -> TensorDataset:
    """Turn a torchvision dataset into X float32 (N, C, H, W) in [0, 1] and y int64 (N,)."""
    data = raw.data
    data = torch.as_tensor(np.asarray(data)) if not isinstance(data, torch.Tensor) else data
    if data.ndim == 3:  # MNIST-like: (N, H, W) uint8
        X = data.unsqueeze(1)
    else:  # CIFAR: (N, H, W, C) uint8
        X = data.permute(0, 3, 1, 2)
    y = torch.as_tensor(np.asarray(raw.targets), dtype=torch.int64)
    return TensorDataset(X.float().div_(255.0).contiguous(), y)


def load_torchvision(
    name: str,
    *,
    train: bool = True,
    root: str | os.PathLike | None = None,
    download: bool = True,
) -> TensorDataset:
    """Load a torchvision dataset from the cache, downloading it once if allowed.

    Raises:
        DatasetUnavailableError: if the files are missing and cannot be downloaded; nothing the
            failed attempt wrote is left behind.
    """
    import torchvision.datasets as tvd

    spec = TORCHVISION_SETS[name]
    cls = getattr(tvd, spec.class_name)
    cache = cache_dir(root)
    folder = cache / spec.folder
    if folder.exists():  # a previous download, or files the user put there by hand
        target, before = folder, _snapshot(folder)
    else:  # download into a temporary folder, then move it in whole: no half-written cache
        target, before = Path(tempfile.mkdtemp(dir=cache, prefix=f".{spec.folder}.partial-")), None
    try:
        # download=True with the files already in place only checks and unpacks them.
        raw = cls(str(target), train=train, download=download)
    except BaseException as exc:  # Ctrl-C included: whatever stopped it, leave no partial files
        if before is None:
            shutil.rmtree(target, ignore_errors=True)
        else:
            _remove_new(before, folder)
        # URLError is an OSError; a truncated archive raises tarfile.ReadError, EOFError or
        # zlib.error; anything else (KeyboardInterrupt, a bug) goes up as it is
        if isinstance(exc, (RuntimeError, OSError, EOFError, tarfile.TarError, zlib.error)):
            raise DatasetUnavailableError(_advice(name, spec, folder, exc)) from None
        raise
    if before is None:
        try:
            os.replace(target, folder)
        except OSError:  # another engine finished first; its copy is as good as ours
            shutil.rmtree(target, ignore_errors=True)
    return _to_tensors(raw)
