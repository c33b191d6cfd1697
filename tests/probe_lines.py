"""No lecture (the tests). Forge what a probe cell prints: every value encoded as the kernel's ``enc``.

The probe cell's encoder lives only as text in
:data:`course_grader.verdict.probe._KERNEL_CODE` (it runs in the student's kernel), and
:func:`course_grader.verdict.probe.encode_cases` encodes the grader's *inputs* in another
format, so the grading tests share this one copy of the kernel's encoder.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np

from course_grader.verdict.probe import MARK

__all__ = ["encode_like_kernel", "probe_line"]


def encode_like_kernel(x: Any) -> Any:
    """Encode one value as the probe cell's kernel code does (arrays as .npy, no pickle)."""
    if isinstance(x, (tuple, list)):
        return {type(x).__name__: [encode_like_kernel(v) for v in x]}
    if x is None:
        return {"none": 1}
    if isinstance(x, str):
        return {"str": x}
    buf = io.BytesIO()
    np.save(buf, np.asarray(x), allow_pickle=False)
    return {"npy": base64.b64encode(buf.getvalue()).decode()}


def probe_line(values: list) -> str:
    """The probe cell's output line: one case's value each, every case passed."""
    return MARK + json.dumps([{"value": encode_like_kernel(v)} for v in values])
