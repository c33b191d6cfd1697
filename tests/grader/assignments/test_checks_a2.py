"""A2's judge on data (what the grader decides from): the partners, the bytes, the number of
messages per partner (so an answer that sends the right bytes piece by piece loses the point),
A2.1's ValueError on a world size that is not a power of two, and A2.3's folding on 3 ranks. The engines' side of the same
judges runs in tests/grader/pipeline/test_grading.py (A2 graded end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from course_grader.assignments.a2.judge import (
    folded_traffic,
    judge_folded,
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


# -- A2.3 folded on 3 ranks: rank 0 gives its buffer to rank 1, ranks 1 and 2 are the core ------

FOLD_SIZE = 10  # the core's chunks on 2 ranks: 5 and 5 elements
INPUTS = [np.arange(FOLD_SIZE, dtype=np.float32) * (q + 1) for q in range(3)]
SUM = sum(INPUTS)


def _folded(rank: int, got=None, peers=None, raised: str = "") -> str:
    """Judge rank ``rank`` of 3; by default it returned the sum with the folding's traffic."""
    want = folded_traffic(FOLD_SIZE, 4, rank, 3)
    if peers is None:
        peers = {q: (m, m, nbytes) for q, (m, nbytes) in want.items()}
    got = SUM if got is None else got
    return judge_folded(FOLD_SIZE, "float32", rank, 3, INPUTS, got, raised, [], peers)


def test_folded_traffic_is_the_whole_buffer_each_way_plus_the_core_on_n_prime():
    whole = FOLD_SIZE * 4
    assert folded_traffic(FOLD_SIZE, 4, 0, 3) == {1: (1, whole)}
    assert folded_traffic(FOLD_SIZE, 4, 1, 3) == {0: (1, whole), 2: (2, whole)}
    assert folded_traffic(FOLD_SIZE, 4, 2, 3) == {1: (2, whole)}
    # 6 ranks: N' = 4, r = 2; ranks 0 and 2 sit out, the core is 1, 3, 4, 5 (core ranks 0..3).
    assert folded_traffic(12, 4, 2, 6) == {3: (1, 48)}
    core = {1: 0, 3: 1, 4: 2, 5: 3}
    for rank, c in core.items():
        sent = folded_traffic(12, 4, rank, 6)
        plain = rabenseifner_bytes_sent("allreduce", 12, 4, c, 4)
        inverse = {v: k for k, v in core.items()}
        assert {q: b for q, (m, b) in sent.items() if q in core} == {
            inverse[q]: b for q, b in plain.items()
        }
        # 2 (N' - 1) / N' of the buffer in the core, plus the fold's whole buffer on odd ranks
        assert sum(b for _, b in sent.values()) == 72 + (48 if rank in (1, 3) else 0)
    # a power of two: the plain algorithm, two messages per partner
    assert folded_traffic(11, 4, 1, 4) == {
        q: (2, b) for q, b in rabenseifner_bytes_sent("allreduce", 11, 4, 1, 4).items()
    }


def test_folded_right_sums_and_traffic_pass_on_every_rank():
    for rank in range(3):
        assert _folded(rank) == "", rank


def test_folded_contribution_lost_names_it():
    lost = INPUTS[1] + INPUTS[2]
    for rank in range(3):
        verdict = _folded(rank, got=lost)
        assert verdict.startswith(
            f"on 3 ranks the result on rank {rank} misses the buffers of ranks [0]"
        )


def test_folded_result_never_sent_back_names_it():
    verdict = _folded(0, got=INPUTS[0])
    assert verdict == (
        "on 3 ranks rank 0 returned its own input; it sat out, so its partner rank 1 must send it "
        "the result at the end"
    )
    verdict = judge_folded(FOLD_SIZE, "float32", 0, 3, INPUTS, None, "", [], {})
    assert verdict.startswith("on 3 ranks rank 0 returned None; it sat out, so its partner rank 1")


def test_folded_ring_and_unfolded_answers_fail_on_partners_bytes_messages():
    # A ring on 3 ranks: rank 0 sends to 1 and receives from 2.
    verdict = _folded(0, peers={1: (2, 0, 28), 2: (0, 2, 0)})
    assert verdict.startswith(
        "on 3 ranks rank 0 sent to ranks [1] and received from [2]; with MPICH's folding its "
        "partners are [1]"
    ), verdict
    # Recursive doubling of whole buffers in the core: the right bytes, one message, not two.
    verdict = _folded(2, peers={1: (1, 1, 40)})
    assert verdict.startswith(
        "size 10: on 3 ranks rank 2 sent 1 messages to rank 1 and received 1; folding exchanges "
        "exactly 2 each way there"
    ), verdict
    # The folded rank sends half its buffer.
    verdict = _folded(0, peers={1: (1, 1, 20)})
    assert verdict.startswith(
        "size 10: on 3 ranks rank 0 sent 20 bytes to rank 1, folding sends exactly 40"
    ), verdict
    # Halving called on 3 ranks: A2.1's ValueError.
    verdict = _folded(1, raised="ValueError")
    assert verdict.startswith("on 3 ranks rank 1 raised ValueError; fold first: with N' = 2"), (
        verdict
    )
    assert "uses the built-in comm.allreduce" in judge_folded(
        FOLD_SIZE, "float32", 1, 3, INPUTS, SUM, "", ["allreduce"], {}
    )
