"""No lecture (the lecturer's documents). What each lecture notebook takes, read from the notebook: words, code, measured run time per cell.

Run times are the ones the notebook's stored outputs carry: Jupyter records, per code cell, when
it started (``iopub.execute_input``) and when the kernel went idle (``iopub.status.idle``) in the
last full run that stored the outputs (on the development machine's 2 cores, under the load of
the moment: ``docs/measurements.md``). The hours model turns them into class time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

__all__ = [
    "LINES_PER_MINUTE",
    "MACHINE_TAG",
    "NOTEBOOKS",
    "SESSION_MINUTES",
    "WORDS_PER_MINUTE",
    "CellTime",
    "LectureFacts",
    "lecture_facts",
    "lecture_notebooks",
]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
#: The hours model. A lecturer explains prose more slowly than one reads it: 50 words a minute
#: (a 90-minute session covers about 3,000 words with pauses and questions), and code at 8 lines
#: a minute; the cells' own run time is added as measured.
WORDS_PER_MINUTE = 50
LINES_PER_MINUTE = 8
SESSION_MINUTES = 90
#: The tag of a cell whose numbers depend on the machine (timings, load): re-run it live.
MACHINE_TAG = "machine-dependent"


@dataclass(frozen=True)
class CellTime:
    """One code cell's measured run time: index in the notebook, seconds, first line, tags, a printed number."""

    index: int
    seconds: float
    first_line: str
    tags: tuple[str, ...]
    sample: str = ""  # the first stored output line holding a number (what a lecturer compares)


@dataclass(frozen=True)
class LectureFacts:
    """What a lecture notebook holds and takes: prose words, code lines, measured run time."""

    lecture: int
    path: Path
    words: int
    code_lines: int
    cells: tuple[CellTime, ...]
    machine_cells: tuple[int, ...]
    engine_lecture: bool = False  # its code starts engines (start_cluster): the room runs it

    @property
    def run_seconds(self) -> float:
        """Return the stored run's time, first cell's start to last cell's end (engine starts included)."""
        return sum(c.seconds for c in self.cells)

    @property
    def minutes(self) -> float:
        """Return the class time the hours model gives: prose, code and the measured run time."""
        return (
            self.words / WORDS_PER_MINUTE
            + self.code_lines / LINES_PER_MINUTE
            + self.run_seconds / 60
        )

    @property
    def sessions(self) -> float:
        """Return the class time in 90-minute sessions."""
        return self.minutes / SESSION_MINUTES

    def long_cells(self, at_least: float = 3.0) -> list[CellTime]:
        """Return the cells that ran ``at_least`` seconds, longest first."""
        return sorted((c for c in self.cells if c.seconds >= at_least), key=lambda c: -c.seconds)


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _words(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?", text))


def _sample(cell: dict) -> str:
    for out in cell.get("outputs", []):
        text = "".join(out.get("text", "")) or "".join(out.get("data", {}).get("text/plain", ""))
        for line in text.splitlines():
            if re.search(r"\d", line) and "Figure size" not in line and "%|" not in line:
                return line.strip().replace("`", "'")
    return ""


def lecture_facts(path: Path) -> LectureFacts:
    """Read one lecture notebook's words, code lines, per-cell run times and machine-dependent cells."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    words = code_lines = 0
    cells, machine = [], []
    engines = False
    for k, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        tags = tuple(cell.get("metadata", {}).get("tags", ()))
        if MACHINE_TAG in tags:
            machine.append(k)
        if cell["cell_type"] == "markdown":
            words += _words(source)
        elif cell["cell_type"] == "code":
            code_lines += sum(1 for line in source.splitlines() if line.strip())
            engines = engines or "start_cluster(" in source
            run = cell.get("metadata", {}).get("execution", {})
            if "iopub.execute_input" in run and "iopub.status.idle" in run:
                seconds = (
                    _time(run["iopub.status.idle"]) - _time(run["iopub.execute_input"])
                ).total_seconds()
                first = source.strip().splitlines()[0] if source.strip() else ""
                cells.append(CellTime(k, seconds, first, tags, _sample(cell)))
    lecture = int(Path(path).name.split("_")[0])
    return LectureFacts(
        lecture, Path(path), words, code_lines, tuple(cells), tuple(machine), engines
    )


def lecture_notebooks(folder: Path = NOTEBOOKS) -> dict[int, Path]:
    """Return lecture number -> notebook for every ``NN_name.ipynb`` in ``folder``."""
    return {int(p.name[:2]): p for p in sorted(folder.glob("[0-9][0-9]_*.ipynb"))}
