"""Lecture 11's timing conclusions: each sentence is computed from the spreads, and swapped or
overlapping numbers give a different sentence (never a hard-coded winner)."""

from __future__ import annotations

from course_lib.parallel.sharded.step_verdicts import allgather_sentence, recomputation_sentence

MESSAGES = {"ZeRO-1": 3, "ZeRO-2": 15}


def test_zero2s_slower_allgather_is_put_down_to_its_messages_only_when_measured():
    slow = allgather_sentence({"ZeRO-1": [0.010, 0.011, 0.012], "ZeRO-2": [0.019, 0.020, 0.022]},
                              MESSAGES, alpha_s=50e-6)  # fmt: skip
    assert "ZeRO-1 is 1.82× faster than ZeRO-2" in slow and "12 extra messages" in slow
    swapped = allgather_sentence({"ZeRO-1": [0.019, 0.020, 0.022], "ZeRO-2": [0.010, 0.011, 0.012]},
                                 MESSAGES, alpha_s=50e-6)  # fmt: skip
    assert "ZeRO-2 is 1.82× faster" in swapped and "do not explain" in swapped
    tied = allgather_sentence({"ZeRO-1": [0.010, 0.015], "ZeRO-2": [0.012, 0.016]},
                              MESSAGES, alpha_s=50e-6)  # fmt: skip
    assert "within this run's noise" in tied and "no gap to explain" in tied


def test_recomputations_cost_is_said_from_the_spreads():
    costs = recomputation_sentence([1.0, 1.02, 1.05], [1.30, 1.33, 1.4], segments=3)
    assert "plain is 1.30× faster than 3 segments" in costs and "30% more" in costs
    swapped = recomputation_sentence([1.30, 1.33, 1.4], [1.0, 1.02, 1.05], segments=3)
    assert (
        "3 segments is 1.30× faster than plain" in swapped and "against the prediction" in swapped
    )
    noise = recomputation_sentence([1.0, 1.3], [1.1, 1.2], segments=3)
    assert "within this run's noise" in noise and "lost in the noise" in noise
