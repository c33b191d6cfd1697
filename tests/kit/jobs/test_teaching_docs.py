"""The lecturer's documents agree with the notebooks and the checks: hours, machine-dependent cells, mistakes.

``docs/teaching/syllabus.md``'s minutes per lecture are recomputed from each notebook's words,
code lines and stored run times (``course_kit.teaching.measure``) and may be off by at most
``MARGIN``; each ``docs/teaching/notes/lectureNN.md`` must list exactly the cells tagged
``machine-dependent`` and exactly the mistakes that the lecture's checks name; every lecture that
starts engines has its run in the emulated room stored (``docs/teaching/room_times.json``) and
stated in the syllabus. No kernel runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_kit.teaching.generate import TEACHING, generated
from course_kit.teaching.measure import lecture_facts, lecture_notebooks
from course_kit.teaching.mistakes import mistakes_of_lecture, module_mistakes
from course_kit.teaching.room_run import ROOM_TIMES, engine_lectures, read_room_times

#: The syllabus states this margin; a lecture whose minutes drift further needs the generator.
MARGIN = 0.15
LECTURES = lecture_notebooks()
FIX = "run python -m course_kit.teaching.generate and re-read the prose around the table"
ROOM_FIX = "python -m course_kit.teaching.room_run NN (about a minute each), then the generator"


def _syllabus_column(name: str) -> dict[int, str]:
    """Return lecture -> the syllabus hours table's cell in the column headed ``name``."""
    body = generated((TEACHING / "syllabus.md").read_text(), "hours")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines()]
    column = rows[0].index(name)
    return {int(r[0].split()[0]): r[column] for r in rows[2:] if r[0].split()[0].isdigit()}


def _syllabus_minutes() -> dict[int, float]:
    return {n: float(v) for n, v in _syllabus_column("class minutes").items()}


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


def _never_run_in_the_room(stored: Path = ROOM_TIMES) -> list[int]:
    """Return the engine lectures that have no stored run in the room."""
    return sorted(set(engine_lectures()) - set(read_room_times(stored)))


def test_every_engine_lecture_has_its_room_run_and_the_syllabus_states_it():
    missing = _never_run_in_the_room()
    assert not missing, f"lectures {missing} were never run in the room: {ROOM_FIX}"
    runs = read_room_times()
    stated = _syllabus_column("run time, room (s)")
    for lecture in LECTURES:
        want = f"{runs[lecture].run_seconds:.0f}" if lecture in runs else "no engines"
        assert stated[lecture] == want, (lecture, stated[lecture], want, FIX)


def test_the_room_check_catches_a_lecture_never_run_in_the_room(tmp_path: Path):
    stored = json.loads(ROOM_TIMES.read_text())
    stored["lectures"].pop("04")
    (tmp_path / "room_times.json").write_text(json.dumps(stored))
    assert _never_run_in_the_room(tmp_path / "room_times.json") == [4]


def test_every_mistake_has_its_text():
    """A refused call's hint held in a module constant is read, not shown as ``None``."""
    blank = [m for n in LECTURES for m in mistakes_of_lecture(n) if m.text.endswith(": None")]
    assert not blank, blank


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
