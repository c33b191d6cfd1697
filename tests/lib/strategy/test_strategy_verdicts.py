"""Lecture 13's conclusions change when their numbers do: each function fed numbers and their opposite.

Reference: the sentence each scoreboard conclusion prints, for made-up spreads where the answer is
known, and for the same spreads swapped (or moved inside each other's range).
"""

from __future__ import annotations

from course_lib.cost_model.op_costs import backward_ratio_sentence
from course_lib.parallel.strategy_verdicts import (
    compute_shares_sentence,
    error_sentence,
    order_sentence,
    pick_sentence,
    rule_sentence,
)
from course_lib.timing import Spread

A, B = "data parallel", "search pick"
FAST, SLOW, NEAR = (
    Spread.of([0.030, 0.031, 0.032]),
    Spread.of([0.050, 0.052, 0.055]),
    Spread.of([0.031, 0.033, 0.034]),
)


def test_the_pick_sentence_follows_the_measurements():
    predicted = {A: 0.04, B: 0.03}
    assert "is the measured best" in pick_sentence(predicted, {A: SLOW, B: FAST})
    swapped = pick_sentence(predicted, {A: FAST, B: SLOW})
    assert "slower when run than the measured best, data parallel" in swapped
    assert "within this run's noise" in pick_sentence(predicted, {A: NEAR, B: FAST})
    assert "within this run's noise" in pick_sentence(predicted, {A: FAST, B: NEAR})


def test_the_order_sentence_counts_agreements_and_noise():
    predicted = {"a": 0.01, "b": 0.02, "c": 0.04}
    agree = {"a": FAST, "b": SLOW, "c": Spread.of([0.09, 0.1])}
    assert "support the simulator's order" in order_sentence(predicted, agree)
    assert "3 the same way" in order_sentence(predicted, agree)
    reverse = {"a": Spread.of([0.09, 0.1]), "b": SLOW, "c": FAST}
    assert "do not support" in order_sentence(predicted, reverse)
    assert "3 the other way" in order_sentence(predicted, reverse)
    noisy = {"a": FAST, "b": NEAR, "c": FAST}
    assert "3 within this run's noise" in order_sentence(predicted, noisy)
    assert "nothing to order" in order_sentence({"a": 0.01, "b": 0.0101}, agree)


def test_the_error_sentence_leans_with_the_numbers():
    assert "2 of 2 predictions below" in error_sentence({A: 0.01, B: 0.01}, {A: FAST, B: SLOW})
    assert "0 of 2 predictions below" in error_sentence({A: 0.1, B: 0.1}, {A: FAST, B: SLOW})


def test_a_rule_is_supported_only_by_a_lead_beyond_the_error():
    assert "support the rule" in rule_sentence("rule 4", A, 774, "tp", 500, 0.2)
    assert "do not support" in rule_sentence("rule 4", A, 774, "tp", 757, 0.2)  # the review's 2 %
    assert "behind" in rule_sentence("rule 4", A, 703, "tp", 751, 0.2)


def test_the_compute_shares_sentence_leans_with_the_numbers():
    assert "larger share of the time" in compute_shares_sentence("convs", 9, 1, "dense", 10, 10)
    assert "smaller share of the time" in compute_shares_sentence("convs", 1, 9, "dense", 10, 10)


def test_a_backward_far_from_twice_the_forward_is_flagged():
    ok, sentence = backward_ratio_sentence(1.0, 2.1)
    assert ok and "trustworthy" in sentence
    ok, sentence = backward_ratio_sentence(1.0, 8.0)  # the review's loaded run
    assert not ok and "WARNING" in sentence and "8.0x" in sentence
    assert not backward_ratio_sentence(2.0, 1.0)[0]
