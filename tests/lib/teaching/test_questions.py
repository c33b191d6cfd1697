"""Each lecture's questions: the key passes the checker, a wrong answer fails, the quiz exports parse and hold every question."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from course_lib.teaching.bank import QUESTIONS, lecture_questions, quiz
from course_lib.teaching.questions import Choice, Numeric, answer_key, check_quiz, is_right
from course_lib.teaching.quiz_export import to_markdown, to_moodle_xml


@pytest.mark.parametrize("lecture", sorted(QUESTIONS))
def test_the_key_passes_and_wrong_answers_fail(lecture: int):
    questions = lecture_questions(lecture)
    assert 5 <= len(questions) <= 10
    key = answer_key(questions)
    assert all(v.passed for v in check_quiz(questions, key, verbose=False))
    for q in questions:
        wrong = (
            q.answer * 1.5 + 1
            if isinstance(q, Numeric)
            else "abcdefgh"[(q.correct + 1) % len(q.options)]
        )
        assert not is_right(q, wrong), q.qid
    assert not any(v.passed for v in check_quiz(questions, {}, verbose=False))


def test_a_numeric_answer_within_its_tolerance_passes():
    q = lecture_questions(10)[0]
    assert is_right(q, q.answer * (1 + q.rel_tol / 2)) and not is_right(
        q, q.answer * (1 + 2 * q.rel_tol)
    )
    assert not is_right(q, "about a half")


def test_quiz_prints_one_line_per_question_without_the_answer(capsys):
    assert quiz(3, {"3.q4": 6}) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(lecture_questions(3)) and "Question 3.q4: PASS" in lines[3]
    assert "12.49" not in "\n".join(lines)


def test_an_unknown_lecture_names_those_with_questions():
    with pytest.raises(ValueError, match="these do"):
        lecture_questions(99)


def test_the_moodle_xml_parses_and_holds_every_question():
    root = ET.fromstring(to_moodle_xml(QUESTIONS))
    questions = [q for q in root.iter("question") if q.get("type") != "category"]
    assert len(questions) == sum(map(len, QUESTIONS.values()))
    assert len(root.findall("question[@type='category']")) == len(QUESTIONS)
    for node in questions:
        fractions = [a.get("fraction") for a in node.findall("answer")]
        assert fractions.count("100") == 1, node.find("name/text").text
        if node.get("type") == "numerical":
            assert float(node.find("answer/tolerance").text) >= 0


def test_the_markdown_quiz_has_every_question_and_its_key():
    text = to_markdown(QUESTIONS)
    for questions in QUESTIONS.values():
        for q in questions:
            assert f"**{q.qid}.**" in text and f"{q.qid}: " in text
    assert isinstance(lecture_questions(3)[-1], Choice)


def test_the_stored_quiz_files_are_the_bank_exported():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "docs" / "teaching" / "quiz"
    assert (folder / "questions.md").read_text() == to_markdown(QUESTIONS), (
        "run python -m course_kit.teaching.quiz"
    )
    assert (folder / "questions.moodle.xml").read_text() == to_moodle_xml(QUESTIONS)
