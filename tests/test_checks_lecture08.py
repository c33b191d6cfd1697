"""Lecture 8's exercise check passes the reference, fails the stub and the tempting mistake."""

from __future__ import annotations

from course_lib.checks.lecture08 import (
    check_values_sent,
    reference_values_sent,
    stub_values_sent,
    two_messages_values_sent,
)


def test_values_sent_check():
    assert check_values_sent(reference_values_sent, verbose=False)
    stub = check_values_sent(stub_values_sent, verbose=False)
    assert not stub and "not implemented" in str(stub)
    wrong = check_values_sent(two_messages_values_sent, verbose=False)
    assert not wrong and "same rank" in str(wrong)
