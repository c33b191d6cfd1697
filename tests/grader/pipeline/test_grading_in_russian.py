"""A Russian submission graded as its English twin: the same points, the reasons in Russian (assignment A1)."""

from __future__ import annotations

from pathlib import Path

import nbformat
from grading_notebooks import A1_FULL, LIMITS
from grading_notebooks import points_of as _points
from grading_notebooks import source_notebook as _source
from grading_notebooks import with_answer as _with_answer

from course_grader.cells import answer_id
from course_grader.grade import grade_notebook, submission_language

ROOT = Path(__file__).resolve().parents[3]
RUSSIAN_A1 = ROOT / "notebooks" / "ru" / "assignments" / "A1_sgd_conv.ipynb"
# A1.3's usual mistake (as in test_grading.py's English twin): overlapping windows overwrite dX.
OVERWRITES = ("dXp[:, rows, cols] += np.tensordot", "dXp[:, rows, cols] = np.tensordot")


def test_a_russian_submission_gets_its_english_twins_points_and_russian_reasons() -> None:
    source = _source("A1_sgd_conv")
    russian = nbformat.read(RUSSIAN_A1, as_version=4)  # the student's Russian edition (stubs)
    assert submission_language(russian, source) == "ru"
    for cell in source.cells:  # the source's answers, A1.3 with the usual mistake
        if (exercise := answer_id(cell)) is not None:
            answer = cell.source.replace(*OVERWRITES) if exercise == "A1.3" else cell.source
            russian = _with_answer(russian, exercise, answer)
    assert any(OVERWRITES[1] in c.source for c in russian.cells if answer_id(c) == "A1.3")
    rows = grade_notebook("ivanova", "A1", source, russian, LIMITS)
    assert _points(rows) == dict(A1_FULL, **{"A1.3": 0.0}), rows  # the English twin's points
    reasons = {r.exercise: r.reason for r in rows}
    assert reasons["A1.1"] == reasons["A1.2"] == "ЗАЧТЕНО", reasons
    assert reasons["A1.3"].startswith(
        "НЕ ЗАЧТЕНО (dX (ядро 3x3, шаг 1, дополнение 0) верен там, где пиксель читает одно окно"
    ), reasons["A1.3"]
