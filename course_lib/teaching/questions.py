"""Every lecture: short questions whose answers are checked by code (numbers with a tolerance, one option of several).

A numeric question's answer is computed from the lecture's formula (the library function that
the lecture uses), never typed in; :func:`check_quiz` prints one verdict line per question, as
the exercises' check cells do, and never stops the notebook.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from course_lib.checks.verdict import Verdict
from course_lib.i18n import _

__all__ = [
    "Choice",
    "Numeric",
    "Question",
    "answer_key",
    "check_quiz",
    "choice",
    "is_right",
    "show_questions",
]


@dataclass(frozen=True)
class Numeric:
    """A question answered by a number: right within ``rel_tol`` of ``answer`` (relative)."""

    qid: str
    text: str
    answer: float
    why: str
    unit: str = ""
    rel_tol: float = 0.02

    def __post_init__(self) -> None:
        if not math.isfinite(self.answer) or self.rel_tol <= 0:
            raise ValueError(f"question {self.qid}: need a finite answer and rel_tol > 0")


@dataclass(frozen=True)
class Choice:
    """A question answered by picking one of ``options``; ``correct`` is the right one's index."""

    qid: str
    text: str
    options: tuple[str, ...]
    correct: int
    why: str

    def __post_init__(self) -> None:
        if not 0 <= self.correct < len(self.options) or len(self.options) < 2:
            raise ValueError(f"question {self.qid}: need >= 2 options and a correct index in them")


Question = Numeric | Choice


def choice(qid: str, text: str, options: tuple[str, ...], correct: int, why: str) -> Choice:
    """Return a :class:`Choice` with its options rotated so the right one's letter varies by id."""
    shift = (sum(map(ord, qid)) + correct) % len(options)
    rotated = options[correct:] + options[:correct]  # the right option first
    rotated = rotated[-shift:] + rotated[:-shift] if shift else rotated
    return Choice(qid, text, tuple(rotated), shift, why)


def is_right(question: Question, response: object) -> bool:
    """Return True when ``response`` answers ``question`` (a number, or an option's letter or text)."""
    if isinstance(question, Numeric):
        try:
            value = float(response)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        return math.isclose(value, question.answer, rel_tol=question.rel_tol, abs_tol=1e-12)
    if isinstance(response, str) and len(response.strip()) == 1 and response.strip().isalpha():
        return ord(response.strip().lower()) - ord("a") == question.correct
    if isinstance(response, int) and not isinstance(response, bool):
        return response == question.correct
    return response == question.options[question.correct]


def answer_key(questions: list[Question]) -> dict[str, object]:
    """Return the right response to every question (a number, or an option's letter)."""
    return {q.qid: q.answer if isinstance(q, Numeric) else "abcdefgh"[q.correct] for q in questions}


def show_questions(questions: list[Question]) -> str:
    """Return the questions as Markdown (options lettered a, b, c, ...), for a notebook cell."""
    lines = []
    for q in questions:
        unit = f" (in {q.unit})" if isinstance(q, Numeric) and q.unit else ""
        lines.append(f"**{q.qid}.** {q.text}{unit}")
        if isinstance(q, Choice):
            lines += [f"   - ({'abcdefgh'[k]}) {o}" for k, o in enumerate(q.options)]
        lines.append("")
    return "\n".join(lines)


def check_quiz(
    questions: list[Question], answers: Mapping[str, object], *, verbose: bool = True
) -> list[Verdict]:
    """Judge ``answers`` (question id -> response); print one line per question when ``verbose``."""
    verdicts = []
    for q in questions:
        if q.qid not in answers:
            v = Verdict(q.qid, "question", False, _("not answered yet"))
        elif is_right(q, answers[q.qid]):
            v = Verdict(q.qid, "question", True, q.why)
        else:
            # the reason, not the answer: the lecture's formula is in the question's section
            v = Verdict(q.qid, "question", False, _("not this one: re-read the section it names"))
        verdicts.append(v)
        if verbose:
            status = _("PASS") if v.passed else _("FAIL")
            print(
                _("Question {qid}: {status} ({detail})").format(
                    qid=q.qid, status=status, detail=v.detail
                )
            )
    return verdicts
