"""Lecture 7: Compressors by name: ``make_compressor("int8")``, ``make_compressor("topk", ratio=0.01)``.

Settings are the keyword arguments of each compressor's settings dataclass, validated there;
``error_feedback=True`` wraps the result in :class:`~course_lib.compression.error_feedback.ErrorFeedback`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from course_lib.compression.base import Compressor
from course_lib.compression.error_feedback import ErrorFeedback
from course_lib.compression.floats import Float16, NoCompression
from course_lib.compression.int8 import Int8MaxAbs, Int8Settings
from course_lib.compression.sparse import (
    RandomK,
    SparseSettings,
    Threshold,
    ThresholdSettings,
    TopK,
)
from course_lib.compression.stochastic import QSGD, QSGDSettings, Sign, SignSettings

__all__ = ["COMPRESSORS", "make_compressor"]

#: name -> (compressor class, its settings dataclass or None)
COMPRESSORS: dict[str, tuple[type[Compressor], type | None]] = {
    "none": (NoCompression, None),
    "float16": (Float16, None),
    "int8": (Int8MaxAbs, Int8Settings),
    "qsgd": (QSGD, QSGDSettings),
    "sign": (Sign, SignSettings),
    "threshold": (Threshold, ThresholdSettings),
    "topk": (TopK, SparseSettings),
    "randomk": (RandomK, SparseSettings),
}


def make_compressor(
    name: str, *, error_feedback: bool = False, momentum_correction: float = 0.0, **settings: Any
) -> Compressor:
    """Return a new compressor ``name`` with ``settings``, wrapped in error feedback if asked.

    ``momentum_correction``: DGC's momentum correction inside the error feedback (the SGD
    momentum, e.g. 0.9; train with ``momentum=0`` then).
    """
    if momentum_correction and not error_feedback:
        raise ValueError(
            "momentum_correction lives in the error feedback's memory: add error_feedback=True"
        )
    try:
        cls, settings_cls = COMPRESSORS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown compressor {name!r}; choose one of {', '.join(COMPRESSORS)}"
        ) from None
    fields = [f.name for f in dataclasses.fields(settings_cls)] if settings_cls else []
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        takes = f"it takes {', '.join(fields)}" if fields else "it takes no settings"
        raise ValueError(f"compressor {name!r} has no setting {', '.join(unknown)}: {takes}")
    compressor = cls(settings_cls(**settings)) if settings_cls else cls()
    if not error_feedback:
        return compressor
    return ErrorFeedback(compressor, momentum=momentum_correction)
