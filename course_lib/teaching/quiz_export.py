"""Every lecture: the question bank as a quiz for the lecturer, in Markdown (with the key) or Moodle XML (Moodle's own import format).

Moodle XML: one ``<question type="numerical">`` (answer with an absolute tolerance) or
``<question type="multichoice">`` (single answer, shuffled) per question, each lecture in its own
category ``$course$/Distributed deep learning/Lecture N``. Written with the standard library's
ElementTree, so the file is well-formed by construction.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping

from course_lib.teaching.questions import Choice, Numeric, Question, answer_key, show_questions

__all__ = ["CATEGORY", "to_markdown", "to_moodle_xml"]

CATEGORY = "$course$/Distributed deep learning"


def to_markdown(bank: Mapping[int, list[Question]], *, key: bool = True) -> str:
    """Return the quiz as Markdown, a section per lecture, and (``key``) the answers after each."""
    parts = ["# Questions, by lecture", ""]
    for lecture, questions in bank.items():
        parts += [f"## Lecture {lecture}", "", show_questions(questions)]
        if key:
            answers = answer_key(questions)
            parts.append(
                "**Key.** " + "; ".join(f"{q.qid}: {_key(q, answers[q.qid])}" for q in questions)
            )
            parts.append("")
    return "\n".join(parts)


def _key(question: Question, answer: object) -> str:
    if isinstance(question, Numeric):
        return f"{answer:.4g} ({question.why}; ±{100 * question.rel_tol:g} %)"
    return f"({answer}) {question.why}"


def _text(parent: ET.Element, tag: str, text: str, fmt: str | None = None) -> ET.Element:
    node = ET.SubElement(parent, tag, {"format": fmt} if fmt else {})
    ET.SubElement(node, "text").text = text
    return node


def _question(quiz: ET.Element, q: Question, lecture: int) -> None:
    kind = "numerical" if isinstance(q, Numeric) else "multichoice"
    node = ET.SubElement(quiz, "question", {"type": kind})
    _text(node, "name", f"L{lecture} {q.qid}")
    unit = f" (in {q.unit})" if isinstance(q, Numeric) and q.unit else ""
    _text(node, "questiontext", f"<p>{_escape(q.text + unit)}</p>", "html")
    _text(node, "generalfeedback", f"<p>{_escape(q.why)}</p>", "html")
    ET.SubElement(node, "defaultgrade").text = "1"
    if isinstance(q, Numeric):
        answer = _text(node, "answer", repr(float(q.answer)))
        answer.set("fraction", "100")
        ET.SubElement(answer, "tolerance").text = repr(abs(q.answer) * q.rel_tol)
        return
    assert isinstance(q, Choice)
    ET.SubElement(node, "single").text = "true"
    ET.SubElement(node, "shuffleanswers").text = "true"
    ET.SubElement(node, "answernumbering").text = "abc"
    for k, option in enumerate(q.options):
        answer = _text(node, "answer", f"<p>{_escape(option)}</p>", "html")
        answer.set("fraction", "100" if k == q.correct else "0")


def _escape(text: str) -> str:
    """Escape text for the HTML inside a Moodle ``<text>`` (ElementTree escapes the XML)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_moodle_xml(bank: Mapping[int, list[Question]]) -> str:
    """Return the quiz as a Moodle XML document, a category per lecture."""
    quiz = ET.Element("quiz")
    for lecture, questions in bank.items():
        category = ET.SubElement(quiz, "question", {"type": "category"})
        _text(category, "category", f"{CATEGORY}/Lecture {lecture}")
        for q in questions:
            _question(quiz, q, lecture)
    ET.indent(quiz)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(quiz, encoding="unicode") + "\n"
