"""No lecture (the lecturer's documents). Adds the teaching cells to a lecture notebook by script: slide tags, ``machine-dependent`` tags, prediction boxes, the questions, the glossary link.

``python -m course_kit.teaching.annotate notebooks/03_communication.ipynb ...`` edits each
notebook in place and is idempotent (a second run changes nothing). Slide tags
(``slide-title``, ``slide-section``, ``slide-formula``, ``slide-figure``, ``slide-live``,
``slide-exercise``) are read by ``./kit slides``; a cell whose stored output is a timing is
tagged ``machine-dependent`` (the lecturer's notes list them). Prediction boxes go around the
measurements that :data:`PREDICTIONS` names by a line of their source, so they survive edits
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
from course_lib.files import atomic_write_text

__all__ = ["GLOSSARY_LINK", "PREDICTIONS", "annotate", "main", "slide_tags"]

GLOSSARY_LINK = "Terms used here: [the course glossary](../docs/teaching/glossary.md)."
_TIMING = re.compile(
    r"perf_counter|time\.time|load_line|timing\.|makespan|\bms\b|bandwidth|seconds"
)

#: lecture -> [(a line of the measuring cell, the prediction cell, the reveal cell)]
PREDICTIONS: dict[int, list[tuple[str, str, str]]] = {
    0: [
        (
            'cluster.view.scatter("part", list(range(10)))',
            'p0a = Prediction("0.a", "`scatter` deals range(10) out to 4 engines: how many values '
            'does engine 0 get?", formula="the first 10 mod 4 engines get one more than 10 // 4")\np0a',
            'p0a.reveal(len(cluster.view.pull("part")[0]), 10 // 4 + 1)',
        ),
        (
            "def one_rank_gives_up():",
            'p0b = Prediction("0.b", "Rank 0 raises before `Barrier`; ranks 1-3 call it. What '
            'happens?", options=("a hang", "a deadlock", "all four raise at once"), '
            'formula="a rank that never joins: a hang (no cycle of waits)")\np0b',
            'p0b.reveal("a hang", "a hang")',
        ),
    ],
    3: [
        (
            "def ring_vs_builtin(n):",
            'p3a = Prediction("3.a", "A ring allreduce on 4 ranks: how many times its buffer\'s '
            'bytes does each rank send?", unit="x buffer", formula="2(N-1)/N")\np3a',
            "p3a.reveal(cluster.run(ring_vs_builtin, 1_000_001)[0][1], 2 * 3 / 4)",
        ),
    ],
    10: [
        (
            "t = simulate(name, [Fraction(1)] * p, m)",
            'p10a = Prediction("10.a", "GPipe, p = 4 balanced stages, m = 8 micro-batches: what '
            'share of the step is the bubble (idle)?", formula="(p-1)/(m+p-1)")\np10a',
            'p10a.reveal(float(simulate("gpipe", [Fraction(1)] * 4, 8).bubble_fraction), '
            "bubble_formula(4, 8))",
        ),
        (
            't = Timeline.merge([r["timeline"] for r in results])',
            'p10b = Prediction("10.b", "The same GPipe pipeline on 4 real engines (emulated '
            'compute, real messages): the measured bubble?", formula="(p-1)/(m+p-1)")\np10b',
            'p10b.reveal(Timeline.merge([r["timeline"] for r in runs["gpipe"]]).bubble_fraction, '
            "bubble_formula(4, 8))",
        ),
    ],
}


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
    return bool(
        _TIMING.search(_src(cell)) or re.search(r"\d+(\.\d+)? ?(ms|s)\b", _outputs_text(cell))
    )


def _add_tags(cell: dict, new: list[str]) -> None:
    tags = cell.setdefault("metadata", {}).setdefault("tags", [])
    tags += [t for t in new if t not in tags]


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
        if not any(imports in _src(c) for c in cells):
            before = imports + before
        cells.insert(at + 1, _cell("code", after, ["prediction", "nbval-ignore-output"]))
        cells.insert(at, _cell("code", before, ["prediction", "nbval-ignore-output"]))
    if not any("## Questions" in _src(c) for c in cells):
        cells += [
            _cell("markdown", "## Questions\n\nAnswer in `my_answers` (a number, or an "
                  "option's letter); the cell under it checks each answer.", []),
            _cell("code", f"from course_lib.teaching.bank import ask, quiz\n\nask({lecture})",
                  ["questions"]),
            _cell("code", f'my_answers = {{}}  # e.g. {{"{lecture}.q1": 0.5, "{lecture}.q5": "a"}}'
                  f"\nquiz({lecture}, my_answers);", ["questions", "nbval-check-output"]),
        ]  # fmt: skip
    for k, cell in enumerate(cells):
        _add_tags(
            cell, slide_tags(cell, k == 0) + ([MACHINE_TAG] if _is_machine_dependent(cell) else [])
        )
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
        print(annotate(Path(name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
