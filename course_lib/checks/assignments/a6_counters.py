"""What A6's judges share: the tolerance, the engines' counters as dicts, the cases' seeds.

The engines (:mod:`course_lib.checks.assignments.a6_collect`) return their counters as lists;
the judges compare them as ``{collective: (calls, bytes)}`` and
``{peer: (messages sent, bytes sent, messages received, bytes received)}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from course_lib.checks.assignments.a6_collect import TRAIN_LR, TRAIN_STEPS

__all__ = ["TOL", "TRAIN_LR", "TRAIN_STEPS", "case_seed", "close", "p2p_of", "used_of"]

TOL = {"rtol": 1e-4, "atol": 1e-5}


def case_seed(default: int, seed: int | None) -> int:
    """The checks' own seed (``seed`` None, as in the notebook), or one from the grader's."""
    return default if seed is None else (int(seed) * 1_000_003 + default) % 2**62


def used_of(used: Any) -> dict[str, tuple[int, int]]:
    """Return {collective: (calls, bytes)} from an engine's [(name, calls, bytes)]."""
    return {str(n): (int(c), int(b)) for n, c, b in used}


def p2p_of(p2p: Any) -> dict[int, tuple[int, int, int, int]]:
    """Return {peer: (messages sent, bytes sent, messages received, bytes received)}."""
    rows = np.asarray(p2p, np.int64).reshape(-1, 5)
    return {int(r[0]): tuple(int(v) for v in r[1:]) for r in rows}


def close(got: Any, want: Any) -> bool:
    """Return whether ``got`` has ``want``'s shape and values (within :data:`TOL`)."""
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    if not isinstance(got, np.ndarray) or got.dtype.kind not in "fiu":
        return False
    return got.shape == want.shape and bool(np.allclose(got, want, **TOL))
