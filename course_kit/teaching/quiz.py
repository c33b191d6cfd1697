"""No lecture (the lecturer's documents). ``python -m course_kit.teaching.quiz [FOLDER]``: the question bank as Markdown (with the key) and Moodle XML."""

from __future__ import annotations

import sys
from pathlib import Path

from course_kit.teaching.measure import ROOT
from course_lib.files import atomic_write_text
from course_lib.teaching.bank import QUESTIONS
from course_lib.teaching.quiz_export import to_markdown, to_moodle_xml

__all__ = ["write_quiz"]


def write_quiz(folder: Path) -> list[Path]:
    """Write ``questions.md`` and ``questions.moodle.xml`` into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        atomic_write_text(folder / "questions.md", to_markdown(QUESTIONS)),
        atomic_write_text(folder / "questions.moodle.xml", to_moodle_xml(QUESTIONS)),
    ]


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "teaching" / "quiz"
    for path in write_quiz(where):
        print(path)
