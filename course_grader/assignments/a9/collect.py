"""What A9.2's check collects on each engine: the answer's output and the counters, as data.

Every engine rebuilds the same whole sequence's queries, keys and values from a seed, keeps its
own contiguous block (chunk ``rank`` of ``chunk_bounds(T, N)``), runs the student's
``ring_attention_forward`` with its communicator and returns the output and its communicator's
counters (the built-in collectives called, messages and bytes per peer), never the answer's
objects. The notebook's check cell sends :func:`collect` to the engines and judges its data in
the kernel (:mod:`course_grader.assignments.a9.judge`); the grader ships this module's *source*
to the graded engines (``course_lib.checks`` is hidden there) and judges the same data in its
own process. So this module imports nothing from ``course_lib.checks`` nor its siblings.

Copied on purpose from :mod:`course_grader.assignments.a7.collect`: ``_counters``, ``_array``
(the engines exec each collect module alone, from its source; it can import no sibling).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SCORE_SPREAD", "collect", "p2p_of", "sequence", "used_of"]

#: The queries are drawn this much wider than the keys: scores spread over several units, so a
#: later block raises a row's running maximum well above the first block's.
SCORE_SPREAD = 3.0


def sequence(case: dict) -> tuple[Any, Any, Any]:
    """Return the whole sequence's (q, k, v), each (heads, T, d) float32, from ``case["seed"]``."""
    import torch

    gen = torch.Generator().manual_seed(int(case["seed"]) % 2**62)
    shape = (case["heads"], case["T"], case["d"])
    q = torch.randn(shape, generator=gen) * SCORE_SPREAD
    k = torch.randn(shape, generator=gen)
    v = torch.randn(shape, generator=gen)
    return q, k, v


def _counters(comm: Any) -> tuple[list, np.ndarray]:
    """Return the built-ins called [(name, calls, bytes)] and the traffic per peer
    [(peer, messages sent, bytes sent, messages received, bytes received)]."""
    used, p2p = comm.stats.as_rows()
    return used, np.array(p2p, np.int64).reshape(-1, 5)


def _array(t: Any) -> np.ndarray | None:
    """A tensor's values (None for anything else): what the engine sends back."""
    import torch

    return t.detach().cpu().numpy().copy() if isinstance(t, torch.Tensor) else None


def collect(comm: Any, fn: Any, case: dict) -> tuple:
    """Run one case of A9.2 on this rank; return (rank, world size, (output, used, p2p))."""
    from course_lib.comm import chunk_bounds

    q, k, v = sequence(case)
    lo, hi = chunk_bounds(case["T"], comm.world_size)[comm.rank]
    mine = [t[:, lo:hi].contiguous() for t in (q, k, v)]
    comm.stats.reset()
    out = fn(comm, *mine, case["T"])
    return comm.rank, comm.world_size, (_array(out), *_counters(comm))


# -- what A9's judge shares: the engines' counters as dicts -----------------------------------
def used_of(used: Any) -> dict[str, tuple[int, int]]:
    """Return {collective: (calls, bytes)} from an engine's [(name, calls, bytes)], barrier aside."""
    return {str(n): (int(c), int(b)) for n, c, b in used if str(n) != "barrier"}


def p2p_of(p2p: Any) -> dict[int, tuple[int, int, int, int]]:
    """Return {peer: (messages sent, bytes sent, messages received, bytes received)}."""
    rows = np.asarray(p2p, np.int64).reshape(-1, 5)
    return {int(r[0]): tuple(int(v) for v in r[1:]) for r in rows}
