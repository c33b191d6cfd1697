"""Timing claims: the sentence follows the numbers, never a hard-coded winner."""

from __future__ import annotations

import pytest

from course_lib.timing import Spread, compare, interleaved_rounds, min_of, ranking, too_noisy


def test_apart_ranges_name_the_faster_and_swapped_numbers_name_the_other():
    fast, slow = [0.010, 0.011, 0.012], [0.020, 0.021, 0.025]
    forward = compare("ring", fast, "tree", slow)
    assert not forward.within_noise and forward.sentence.startswith(
        "ring is 1.91× faster than tree"
    )
    swapped = compare("ring", slow, "tree", fast)
    assert swapped.sentence.startswith("tree is 1.91× faster than ring")


def test_overlapping_ranges_say_noise_and_name_no_winner():
    result = compare("zero1", [0.010, 0.014, 0.020], "ddp", [0.012, 0.013, 0.030])
    assert result.within_noise
    assert "within this run's noise" in result.sentence and "faster" not in result.sentence


def test_ranking_marks_ties_and_gaps():
    lines = ranking({"a": [1.0, 1.1], "b": [1.05, 1.2], "c": [3.0, 3.1]})
    assert lines[0].startswith("1. a") and "within noise" in lines[1] and "× its time" in lines[2]


def test_spread_noise_and_description():
    assert too_noisy(Spread.of([1.0, 2.0, 1.1])) and not too_noisy(Spread.of([1.0, 1.05, 1.1]))
    assert Spread.of([0.0123]).describe() == "12.3 ms (1 round: no spread)"
    with pytest.raises(ValueError, match="at least one sample"):
        Spread.of([])


def test_interleaved_rounds_run_each_candidate_in_turn():
    order: list[str] = []
    spreads = interleaved_rounds(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3
    )
    assert order == ["a", "b"] * 4 and len(spreads["a"].samples) == 3
    assert min_of(lambda: None, repeats=3) >= 0
