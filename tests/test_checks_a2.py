"""A2's judge on data (what the grader decides from): the partners, the bytes, the number of
messages per partner (so an answer that sends the right bytes piece by piece loses the point),
and A2.1's ValueError on a world size that is not a power of two. The engines' side of the same
judges runs in tests/test_grading.py (A2 graded end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.checks.assignments.a2 import (
    judge_not_power_of_two,
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


def test_a2_1_on_3_ranks_wants_a_value_error_before_any_message():
    assert judge_not_power_of_two(0, 3, "ValueError", 0) == ""
    # Without the check, ranks 0 and 1 finish their exchange and return (a wrong chunk).
    verdict = judge_not_power_of_two(0, 3, "", 1)
    assert verdict.startswith("on 3 ranks (not a power of two) rank 0 returned; raise ValueError")
    # Rank 2's partner 3 does not exist: the communicator's own ValueError, after ranks 0 and 1
    # have gone ahead, is not the answer's check.
    verdict = judge_not_power_of_two(2, 3, "ValueError", 1)
    assert "sent 1 messages before its ValueError" in verdict, verdict
    verdict = judge_not_power_of_two(1, 3, "CommTimeoutError", 0)
    assert verdict.startswith("on 3 ranks (not a power of two) rank 1 raised CommTimeoutError")
