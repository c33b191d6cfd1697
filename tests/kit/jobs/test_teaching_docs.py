"""The lecturer's documents agree with the notebooks and the checks: hours, machine-dependent cells, mistakes.

``docs/teaching/syllabus.md``'s minutes per lecture are recomputed from each notebook's words,
code lines and stored run times (``course_kit.teaching.measure``) and may be off by at most
``MARGIN``; each ``docs/teaching/notes/lectureNN.md`` must list exactly the cells tagged
``machine-dependent`` and exactly the mistakes that the lecture's checks name. No kernel runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from course_kit.teaching.generate import TEACHING, generated
from course_kit.teaching.measure import lecture_facts, lecture_notebooks
from course_kit.teaching.mistakes import mistakes_of_lecture, module_mistakes

#: The syllabus states this margin; a lecture whose minutes drift further needs the generator.
MARGIN = 0.15
LECTURES = lecture_notebooks()
FIX = "run python -m course_kit.teaching.generate and re-read the prose around the table"


def _syllabus_minutes() -> dict[int, float]:
    body = generated((TEACHING / "syllabus.md").read_text(), "hours")
    rows = re.findall(r"^\| (\d+) `[^`]+` \|[^|]*\|[^|]*\|[^|]*\| (\d+) \|", body, flags=re.M)
    return {int(lecture): float(minutes) for lecture, minutes in rows}


def test_the_syllabus_names_the_margin_it_is_held_to():
    assert f"{MARGIN * 100:.0f} %" in (TEACHING / "syllabus.md").read_text()


def test_the_syllabus_hours_match_the_notebooks():
    stated = _syllabus_minutes()
    assert set(stated) == set(LECTURES), (
        f"syllabus rows {sorted(stated)}, notebooks {sorted(LECTURES)}: {FIX}"
    )
    wrong = []
    for lecture, path in LECTURES.items():
        measured = lecture_facts(path).minutes
        if abs(stated[lecture] - measured) > MARGIN * measured:
            wrong.append(
                f"lecture {lecture}: syllabus {stated[lecture]:.0f} min, notebook {measured:.0f}"
            )
    assert not wrong, "; ".join(wrong) + f": {FIX}"


def test_the_hours_check_catches_a_heavier_notebook(tmp_path: Path):
    path = LECTURES[3]
    heavy = path.read_text().replace('"cell_type": "markdown",', '"cell_type": "markdown",', 1)
    target = tmp_path / path.name
    target.write_text(heavy.replace('"source": [', '"source": ["' + "word " * 3000 + '", ', 1))
    assert lecture_facts(target).minutes > (1 + MARGIN) * _syllabus_minutes()[3]


@pytest.mark.parametrize("lecture", sorted(LECTURES))
def test_the_notes_list_exactly_the_machine_dependent_cells(lecture: int):
    notes = (TEACHING / "notes" / f"lecture{lecture:02d}.md").read_text()
    listed = [int(k) for k in re.findall(r"^- cell (\d+):", generated(notes, "machine"), re.M)]
    assert listed == list(lecture_facts(LECTURES[lecture]).machine_cells), FIX


@pytest.mark.parametrize("lecture", sorted(LECTURES))
def test_the_notes_list_exactly_the_mistakes_the_checks_name(lecture: int):
    notes = (TEACHING / "notes" / f"lecture{lecture:02d}.md").read_text()
    listed = re.findall(r"^- \*\*([\d.]+|any)\*\*: `(.*)`$", generated(notes, "mistakes"), re.M)
    want = [(m.exercise or "any", m.text.replace("`", "'")) for m in mistakes_of_lecture(lecture)]
    assert listed == want, FIX


def test_the_mistake_reader_finds_a_new_message_and_its_exercise(tmp_path: Path):
    planted = tmp_path / "lecture42.py"
    planted.write_text(
        'REFUSED = {"42.1": {"course_lib.timing.compare": "write it yourself"}}\n'
        "def _body(fn):\n"
        '    assert fn() == 1, f"got {fn()}, expected 1"\n'
        "def _problem(x) -> str | None:\n"
        '    return None if x else "x was empty"\n'
        "def check(fn):\n"
        '    return run_check("42.1", "name", lambda: _body(fn) or _problem(fn))\n'
    )
    texts = {(m.exercise, m.text) for m in module_mistakes(planted)}
    assert texts == {
        ("42.1", "calling course_lib.timing.compare: write it yourself"),
        ("42.1", "got {fn()}, expected 1"),
        ("42.1", "x was empty"),
    }
    assert [m.exercise for m in mistakes_of_lecture(42, tmp_path)] == ["42.1"] * 3
