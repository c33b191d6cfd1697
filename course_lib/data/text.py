"""Lecture 11: text that works offline, for the small transformer: the standard library's own docs.

Every Python installation carries the docstrings of its standard library, so the course needs no
download for a language-modelling task: :func:`stdlib_text` joins the docstrings of a fixed list
of modules (about 100 kB of English for Python 3.11; the exact text follows the Python version).
Characters are the tokens: :data:`VOCAB` is printable ASCII (95 characters) and the newline, and
anything else becomes ``"?"``. :func:`load_text` cuts the text into windows of ``block``
characters, each with its targets: the same window moved one character on.
"""

from __future__ import annotations

import importlib
import inspect
import string

import torch
from torch.utils.data import TensorDataset

__all__ = ["MODULES", "VOCAB", "decode", "encode", "load_text", "stdlib_text"]

#: The modules whose docstrings (module, classes, functions) make the text, in this order.
MODULES = (
    "json", "csv", "argparse", "collections", "functools", "itertools", "pathlib", "re",
    "statistics", "textwrap", "typing", "datetime", "random", "heapq", "fractions", "decimal",
    "string", "shutil", "tempfile", "logging",
)  # fmt: skip
VOCAB = "\n" + "".join(c for c in string.printable if c.isprintable())
_INDEX = {c: i for i, c in enumerate(VOCAB)}


def stdlib_text() -> str:
    """Return the docstrings of :data:`MODULES` and of their public classes and functions."""
    parts = []
    for name in MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for attr in sorted(getattr(module, "__all__", None) or dir(module)):
            obj = getattr(module, attr, None)
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                parts.append(inspect.getdoc(obj) or "")
    return "\n\n".join(p for p in parts if p)


def encode(text: str) -> torch.Tensor:
    """Return the token ids (int64) of ``text``; characters outside :data:`VOCAB` become "?"."""
    unknown = _INDEX["?"]
    return torch.tensor([_INDEX.get(c, unknown) for c in text], dtype=torch.int64)


def decode(ids: torch.Tensor) -> str:
    """Return the text of token ids."""
    return "".join(VOCAB[int(i)] for i in ids)


def load_text(block: int = 64, train: bool = True, test_share: float = 0.1) -> TensorDataset:
    """Return windows of ``block`` characters and their next characters, (N, block) each.

    The first ``1 - test_share`` of the text trains, the rest tests; windows do not overlap.
    """
    if block < 2:
        raise ValueError(f"block must be at least 2 characters, got {block}")
    if not 0 < test_share < 1:
        raise ValueError(f"test_share must lie in (0, 1), e.g. 0.1, got {test_share}")
    ids = encode(stdlib_text())
    cut = int(len(ids) * (1 - test_share))
    part = ids[:cut] if train else ids[cut:]
    n = (len(part) - 1) // block
    if n < 1:
        raise ValueError(f"block={block} is longer than the {len(part)} characters of this split")
    x = part[: n * block].view(n, block)
    y = part[1 : n * block + 1].view(n, block)
    return TensorDataset(x, y)
