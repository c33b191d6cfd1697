"""No lecture (the lecturer's documents). Adds the teaching cells to a lecture notebook by script: slide tags, ``machine-dependent`` tags, prediction boxes, the questions, the glossary link.

``python -m course_kit.teaching.annotate notebooks/03_communication.ipynb ...`` edits each
notebook in place and is idempotent (a second run changes nothing). Slide tags
(``slide-title``, ``slide-section``, ``slide-formula``, ``slide-figure``, ``slide-live``,
``slide-exercise``) are read by ``./kit slides``; a cell whose stored output is a timing is
tagged ``machine-dependent`` (the lecturer's notes list them). Prediction boxes go around the
measurements that :data:`~course_kit.teaching.predictions.PREDICTIONS` names by a line of their source, so they survive edits
elsewhere. Then re-run the notebook to store its outputs, and
``python -m course_kit.teaching.generate`` to refresh the notes' cell numbers.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from course_kit.teaching.measure import MACHINE_TAG
from course_kit.teaching.predictions import PREDICTIONS
from course_lib.files import atomic_write_text
from course_lib.teaching.bank import QUESTIONS

__all__ = ["GLOSSARY_LINK", "annotate", "main", "slide_tags"]

GLOSSARY_LINK = "Terms used here: [the course glossary](../docs/teaching/glossary.md)."
_TIMING = re.compile(
    r"perf_counter|time\.time|load_line|timing\.|makespan|\bms\b|bandwidth|seconds"
)


def _cell(kind: str, source: str, tags: list[str]) -> dict:
    ident = hashlib.sha1(source.encode()).hexdigest()[:12]  # nbformat 4.5's cell id, stable
    cell = {"cell_type": kind, "id": ident, "metadata": {"tags": tags}, "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def _outputs_text(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


def slide_tags(cell: dict, first: bool) -> list[str]:
    """Return the slide tags a cell earns: title, section, formula, figure, live demo, exercise."""
    source = _src(cell)
    tags = []
    if cell["cell_type"] == "markdown":
        if first:
            tags.append("slide-title")
        elif source.startswith("## Exercise") or source.startswith("## Questions"):
            tags.append("slide-exercise")
        elif source.startswith("## "):
            tags.append("slide-section")
        if "$$" in source:
            tags.append("slide-formula")
    else:
        if any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
            tags.append("slide-figure")
        if re.search(r"start_cluster|cluster\.run|%%?px|\.view\.", source):
            tags.append("slide-live")
    return tags


def _is_machine_dependent(cell: dict) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    if cell["cell_type"] != "code" or "nbval-ignore-output" not in tags:
        return False
    if "Prediction(" in _src(cell):  # the box asks; its unit is not a timing
        return False
    return bool(
        _TIMING.search(_src(cell)) or re.search(r"\d+(\.\d+)? ?(ms|s)\b", _outputs_text(cell))
    )


def _add_tags(cell: dict, new: list[str]) -> None:
    tags = cell.setdefault("metadata", {}).setdefault("tags", [])
    tags += [t for t in new if t not in tags]


def _import_once(cells: list[dict], imports: str) -> None:
    """Put the import of :class:`Prediction` in the first prediction cell, and only there."""
    boxes = [
        c
        for c in cells
        if "Prediction(" in _src(c) and "prediction" in c["metadata"].get("tags", [])
    ]
    for k, cell in enumerate(boxes):
        body = _src(cell).replace(imports, "")
        cell["source"] = imports + body if k == 0 else body


def annotate(path: Path) -> Path:
    """Add the teaching cells and tags to the notebook at ``path`` (in place); return the path."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    lecture = int(Path(path).name[:2])
    cells = nb["cells"]
    if GLOSSARY_LINK not in _src(cells[0]):
        cells[0]["source"] = _src(cells[0]).rstrip("\n") + "\n\n" + GLOSSARY_LINK
    have = {_src(c) for c in cells}
    imports = "from course_lib.teaching.predict import Prediction\n"
    for anchor, before, after in PREDICTIONS.get(lecture, []):
        if any(before in s for s in have):
            continue
        at = next(k for k, c in enumerate(cells) if anchor in _src(c) and c["cell_type"] == "code")
        cells.insert(at + 1, _cell("code", after, ["prediction", "nbval-ignore-output"]))
        cells.insert(at, _cell("code", before, ["prediction", "nbval-ignore-output"]))
    _import_once(cells, imports)
    if lecture in QUESTIONS and not any("## Questions" in _src(c) for c in cells):
        cells += [
            _cell("markdown", "## Questions\n\nAnswer in `my_answers` (a number, or an "
                  "option's letter); the cell under it checks each answer.", []),
            _cell("code", f"from course_lib.teaching.bank import ask, quiz\n\nask({lecture})",
                  ["questions"]),
            _cell("code", f'my_answers = {{}}  # e.g. {{"{lecture}.q1": 0.5, "{lecture}.q5": "a"}}'
                  f"\nscore = quiz({lecture}, my_answers)", ["questions", "nbval-check-output"]),
        ]  # fmt: skip
    for (
        cell
    ) in cells:  # older runs ended the cell with "quiz(N, my_answers);": nbval shows its value
        if "questions" in cell["metadata"].get("tags", []):
            cell["source"] = re.sub(
                r"\nquiz\((\d+), my_answers\);", r"\nscore = quiz(\1, my_answers)", _src(cell)
            )
    for k, cell in enumerate(cells):
        _add_tags(
            cell, slide_tags(cell, k == 0) + ([MACHINE_TAG] if _is_machine_dependent(cell) else [])
        )
        if MACHINE_TAG in cell["metadata"]["tags"] and not _is_machine_dependent(cell):
            cell["metadata"]["tags"].remove(MACHINE_TAG)
        if not cell["metadata"]["tags"]:
            del cell["metadata"]["tags"]
    atomic_write_text(path, json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    """Annotate each notebook named in ``argv``; return 0 (2 when none is named)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m course_kit.teaching.annotate NOTEBOOK.ipynb ...", file=sys.stderr)
        return 2
    for name in argv:
        if not Path(name).is_file():
            print(
                f"annotate: no notebook {name}; name lecture notebooks, e.g. notebooks/04_data_parallel.ipynb",
                file=sys.stderr,
            )
            return 2
        print(annotate(Path(name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
