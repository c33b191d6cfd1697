"""No lecture (the lecturer's documents). Writes the generated parts of ``docs/teaching/``: the syllabus's hours, each lecture's cell times, machine-dependent cells and mistakes.

``python -m course_kit.teaching.generate`` rewrites, in place, only what lies between
``<!-- generated: NAME -->`` and ``<!-- end generated -->`` in ``docs/teaching/syllabus.md`` and
``docs/teaching/notes/lectureNN.md`` (a missing notes file is started from a short template); the
prose around them is the lecturer's. ``--check`` changes nothing and exits 1 when a file is stale.
The tests read the same facts and fail when the documents drift from the notebooks and checks.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from course_kit.teaching.measure import (
    MACHINE_TAG,
    ROOT,
    LectureFacts,
    lecture_facts,
    lecture_notebooks,
)
from course_kit.teaching.mistakes import mistakes_of_lecture

__all__ = [
    "TEACHING",
    "hours_table",
    "machine_section",
    "main",
    "mistakes_section",
    "replace_generated",
    "times_section",
]

TEACHING = ROOT / "docs" / "teaching"
_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)


def replace_generated(text: str, name: str, body: str) -> str:
    """Return ``text`` with the block ``name``'s body replaced by ``body``."""
    done = []

    def swap(match: re.Match) -> str:
        if match["name"] != name:
            return match[0]
        done.append(name)
        return match[1] + body.rstrip("\n") + "\n" + match[4]

    out = _BLOCK.sub(swap, text)
    if not done:
        raise ValueError(f"no '<!-- generated: {name} -->' block: add one where it belongs")
    return out


def generated(text: str, name: str) -> str:
    """Return the body of the block ``name`` in ``text`` ('' when there is none)."""
    for match in _BLOCK.finditer(text):
        if match["name"] == name:
            return match["body"]
    return ""


def hours_table(facts: list[LectureFacts]) -> str:
    """Return the syllabus's table of class time per lecture, from the notebooks."""
    rows = [
        "| lecture | prose words | code lines | run time, 2 cores (s) | class minutes | sessions of 90 min |",
        "|---|---|---|---|---|---|",
    ]
    for f in facts:
        rows.append(
            f"| {f.lecture} `{f.path.name}` | {f.words} | {f.code_lines} | {f.run_seconds:.0f} "
            f"| {f.minutes:.0f} | {f.sessions:.2f} |"
        )
    total = sum(f.minutes for f in facts)
    rows.append(f"| all | | | | {total:.0f} | {total / 90:.1f} |")
    return "\n".join(rows)


def times_section(f: LectureFacts) -> str:
    """Return the notes' list of long cells (3 s or more) with their measured times."""
    long = f.long_cells()
    if not long:
        return "No cell ran 3 s or longer in the stored run.\n"
    lines = [
        f"Stored run: {f.run_seconds:.0f} s on 2 cores. Cells of 3 s or more, longest first:",
        "",
    ]
    lines += [f"- cell {c.index} ({c.seconds:.1f} s): `{c.first_line[:70]}`" for c in long]
    return "\n".join(lines) + "\n"


def machine_section(f: LectureFacts) -> str:
    """Return the notes' list of the cells tagged ``machine-dependent`` (re-run them live)."""
    if not f.machine_cells:
        return f"No cell is tagged `{MACHINE_TAG}` yet.\n"
    by_index = {c.index: c for c in f.cells}
    lines = [
        "Stored values are the development machine's (2 cores, loaded); the room's were not",
        "measured here: expect other times, the same ratios' direction and the same verdicts.",
        "",
    ]
    for k in f.machine_cells:
        cell = by_index.get(k)
        first = cell.first_line[:70] if cell else ""
        seen = (
            f" (stored: {cell.seconds:.1f} s; prints `{cell.sample[:80]}`)"
            if cell and cell.sample
            else ""
        )
        lines.append(f"- cell {k}: `{first}`{seen}")
    return "\n".join(lines) + "\n"


def mistakes_section(lecture: int) -> str:
    """Return the notes' list of the mistakes the lecture's checks name, by exercise."""
    found = mistakes_of_lecture(lecture)
    if not found:
        return "The checks of this lecture name no mistakes.\n"
    lines = []
    for m in found:
        text = m.text.replace("`", "'")
        lines.append(f"- **{m.exercise or 'any'}**: `{text}`")
    return "\n".join(lines) + "\n"


_TEMPLATE = """# Lecture {n}: notes for the lecturer

Notebook: `notebooks/{name}`.

## Long cells

<!-- generated: times -->
<!-- end generated -->

## Cells whose numbers depend on the machine

<!-- generated: machine -->
<!-- end generated -->

## Typical mistakes (what the checks say)

<!-- generated: mistakes -->
<!-- end generated -->
"""


def render(root: Path = TEACHING) -> dict[Path, str]:
    """Return every teaching document with its generated blocks up to date."""
    facts = [lecture_facts(p) for p in lecture_notebooks().values()]
    out: dict[Path, str] = {}
    syllabus = root / "syllabus.md"
    out[syllabus] = replace_generated(syllabus.read_text(), "hours", hours_table(facts))
    for f in facts:
        path = root / "notes" / f"lecture{f.lecture:02d}.md"
        text = (
            path.read_text() if path.exists() else _TEMPLATE.format(n=f.lecture, name=f.path.name)
        )
        text = replace_generated(text, "times", times_section(f))
        text = replace_generated(text, "machine", machine_section(f))
        out[path] = replace_generated(text, "mistakes", mistakes_section(f.lecture))
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated blocks (``--check``: only report the stale files); return the status."""
    argv = sys.argv[1:] if argv is None else argv
    stale = []
    for path, text in render().items():
        if not path.exists() or path.read_text() != text:
            stale.append(path.relative_to(ROOT))
            if "--check" not in argv:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    verb = "stale" if "--check" in argv else "rewritten"
    print(f"{len(stale)} teaching documents {verb}" + "".join(f"\n  {p}" for p in stale))
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    raise SystemExit(main())
