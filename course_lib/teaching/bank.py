"""Every lecture: the question bank, lecture number -> its questions (:func:`lecture_questions`)."""

from __future__ import annotations

from course_lib.teaching.bank_early import EARLY
from course_lib.teaching.bank_later import LATER
from course_lib.teaching.bank_others import OTHERS
from course_lib.teaching.bank_transformer import TRANSFORMER
from course_lib.teaching.questions import Question, check_quiz, show_questions

__all__ = ["QUESTIONS", "ask", "lecture_questions", "quiz"]

QUESTIONS: dict[int, list[Question]] = dict(
    sorted({**EARLY, **LATER, **OTHERS, **TRANSFORMER}.items())
)


def lecture_questions(lecture: int) -> list[Question]:
    """Return lecture ``lecture``'s questions; a lecture without any names those that have some."""
    if lecture not in QUESTIONS:
        raise ValueError(f"lecture {lecture} has no questions yet; these do: {sorted(QUESTIONS)}")
    return QUESTIONS[lecture]


def ask(lecture: int):
    """Show lecture ``lecture``'s questions as Markdown (a notebook cell's last expression)."""
    from IPython.display import Markdown

    return Markdown(show_questions(lecture_questions(lecture)))


def quiz(lecture: int, answers: dict) -> int:
    """Print a verdict per question for ``answers`` (id -> response); return how many passed."""
    return sum(v.passed for v in check_quiz(lecture_questions(lecture), answers))
