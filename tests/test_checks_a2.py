"""A2's judge on data (what the grader decides from): the partners, the bytes and, new, the number
of messages per partner, so an answer that sends the right bytes piece by piece loses the point.
The engines' side of the same judge runs in tests/test_grading.py (A2 graded end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.checks.assignments.a2 import (
    judge_rank,
    rabenseifner_bytes_sent,
    rabenseifner_partners,
)
from course_lib.comm.buffers import chunk_bounds

SIZE, WORLD = 11, 4  # uneven chunks: 3, 3, 3, 2


def _case(kind: str, rank: int, messages: int) -> str:
    """Judge rank ``rank`` that returned the right values with ``messages`` per partner each way."""
    reference = np.arange(SIZE, dtype=np.float32) * WORLD
    lo, hi = chunk_bounds(SIZE, WORLD)[rank]
    got = reference[lo:hi] if kind == "reduce_scatter" else reference
    sent = rabenseifner_bytes_sent(kind, SIZE, 4, rank, WORLD)
    peers = {p: (messages, messages, sent[p]) for p in rabenseifner_partners(rank, WORLD)}
    return judge_rank(kind, SIZE, "float32", rank, WORLD, reference, got, [], peers)


@pytest.mark.parametrize(
    ("kind", "steps"), [("reduce_scatter", 1), ("allgather", 1), ("allreduce", 2)]
)
def test_the_right_bytes_in_one_message_per_step_pass_and_piece_by_piece_fails(kind, steps):
    for rank in range(WORLD):
        assert _case(kind, rank, steps) == "", (kind, rank)
        verdict = _case(kind, rank, steps + 1)
        assert f"sent {steps + 1} messages to rank" in verdict, verdict
        assert "one message each way per step" in verdict and "not piece by piece" in verdict
