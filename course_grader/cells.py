"""How assignment notebooks mark their cells, and how a solution becomes a stub.

Every graded cell carries ``metadata["course"]``, written by the instructor in the source and
kept by JupyterLab in the student's copy:

* ``{"answer": "A2.1"}`` — the student's answer cell for exercise A2.1; its code between
  ``### BEGIN SOLUTION`` and ``### END SOLUTION`` is replaced by a stub at release;
* ``{"check": "A2.1", "points": 2}`` — the check cell; its stored output (the PASS verdict) is
  what nbval compares the re-executed output with when grading.

The grader identifies answer cells by this metadata only, so a student who re-orders, adds or
deletes other cells changes nothing.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "BEGIN",
    "END",
    "CHECK_MARKER",
    "UNGRADED_HINT",
    "answer_id",
    "check_id",
    "check_points",
    "has_solution",
    "output_is_compared",
    "stub_solution",
]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
CHECK_MARKER = "# NBVAL_CHECK_OUTPUT"
UNGRADED_HINT = "no answer was graded"  # the stub's hint where a submission has no answer
_REGION = re.compile(
    r"^(?P<indent>[ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)",
    re.MULTILINE | re.DOTALL,
)


def _course(cell: Any) -> dict[str, Any]:
    return cell.get("metadata", {}).get("course", {}) or {}


def answer_id(cell: Any) -> str | None:
    """Return the exercise id of an answer cell, or None for any other cell."""
    return _course(cell).get("answer")


def check_id(cell: Any) -> str | None:
    """Return the exercise id of a check cell, or None for any other cell."""
    return _course(cell).get("check")


def check_points(cell: Any) -> float:
    """Return the points a check cell is worth (1 when the source does not say)."""
    return float(_course(cell).get("points", 1))


def output_is_compared(cell: Any) -> bool:
    """Return True when nbval compares this code cell's stored output (``--nbval-lax``)."""
    return any(line.strip() == CHECK_MARKER for line in cell.get("source", "").splitlines())


def has_solution(source: str) -> bool:
    """Return True when ``source`` still holds a marked solution region."""
    return BEGIN in source or END in source


def stub_solution(source: str, exercise: str, hint: str) -> str:
    """Replace every solution region with ``raise NotImplementedError("Exercise X: hint")``.

    The ``raise`` keeps the indentation of the ``BEGIN`` marker, so a region inside a function
    body leaves a function that still parses.
    """
    if source.count(BEGIN) != source.count(END):
        raise ValueError(
            f"exercise {exercise}: unbalanced solution markers (every {BEGIN!r} needs an {END!r})"
        )
    message = f"Exercise {exercise}: {hint}".replace('"', "'")

    def replace(match: re.Match[str]) -> str:
        return f'{match["indent"]}raise NotImplementedError("{message}")\n'

    stubbed = _REGION.sub(replace, source)
    if has_solution(stubbed):
        raise ValueError(f"exercise {exercise}: a solution marker is left after stubbing")
    return stubbed.rstrip("\n")
