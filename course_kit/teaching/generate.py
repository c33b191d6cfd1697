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
    CellTime,
    LectureFacts,
    lecture_facts,
    lecture_notebooks,
)
from course_kit.teaching.mistakes import mistakes_of_lecture
from course_kit.teaching.room_run import RoomRun, read_room_times
from course_lib.i18n import _, speaking

__all__ = [
    "TEACHING",
    "generated_blocks",
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


def _room_seconds(run: RoomRun | None, f: LectureFacts) -> str:
    """Return the lecture's run time in the room, or why there is none."""
    if run is None:
        return _("no engines") if not f.engine_lecture else _("not run")
    return f"{run.run_seconds:.0f}"


def hours_table(facts: list[LectureFacts], room: dict[int, RoomRun] | None = None) -> str:
    """Return the syllabus's table of class time per lecture, from the notebooks (and room runs)."""
    room = {} if room is None else room
    rows = [
        _(
            "| lecture | prose words | code lines | run time, 2 cores (s) | run time, room (s) "
            "| class minutes | sessions of 90 min |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for f in facts:
        rows.append(
            f"| {f.lecture} `{f.path.name}` | {f.words} | {f.code_lines} | {f.run_seconds:.0f} "
            f"| {_room_seconds(room.get(f.lecture), f)} | {f.minutes:.0f} | {f.sessions:.2f} |"
        )
    total = sum(f.minutes for f in facts)
    everything = _("all")
    rows.append(f"| {everything} | | | | | {total:.0f} | {total / 90:.1f} |")
    return "\n".join(rows)


def _in_room(cell: CellTime, run: RoomRun | None) -> str:
    """Return ``; room X s`` for a cell the room run timed (and whose code has not changed since)."""
    if run is None or cell.index not in run.seconds:
        return ""
    if run.first_lines.get(cell.index) != cell.first_line:
        return _("; room: changed since the room's run")
    return _("; room {seconds} s").format(seconds=f"{run.seconds[cell.index]:.1f}")


def times_section(f: LectureFacts, run: RoomRun | None = None) -> str:
    """Return the notes' list of long cells (3 s or more) with their measured times."""
    long = f.long_cells()
    if not long:
        return _("No cell ran 3 s or longer in the stored run.") + "\n"
    total = f"{f.run_seconds:.0f}"
    if run is None:
        head = _("Stored run: {seconds} s on 2 cores. Cells of 3 s or more, longest first:")
        head = head.format(seconds=total)
    else:
        head = _(
            "Stored run: {seconds} s on 2 cores; {room} s in the emulated room (load {load}, "
            "`docs/teaching/room_times.json`). Cells of 3 s or more, longest first:"
        ).format(seconds=total, room=f"{run.run_seconds:.0f}", load=f"{run.load[0]:.1f}")
    lines = [head, ""]
    lines += [
        _("- cell {index} ({seconds} s{room}): `{code}`").format(
            index=c.index, seconds=f"{c.seconds:.1f}", room=_in_room(c, run), code=c.first_line[:70]
        )
        for c in long
    ]
    return "\n".join(lines) + "\n"


def machine_section(f: LectureFacts, run: RoomRun | None = None) -> str:
    """Return the notes' list of the cells tagged ``machine-dependent`` (re-run them live)."""
    if not f.machine_cells:
        return _("No cell is tagged `{tag}` yet.").format(tag=MACHINE_TAG) + "\n"
    by_index = {c.index: c for c in f.cells}
    if run is not None:
        head = _(
            "Stored values are the development machine's (2 cores, loaded); the emulated room's "
            "times are beside them (its PCs share the same 2 cores):"
        )
    else:
        head = _(
            "Stored values are the development machine's (2 cores, loaded); the room's were not "
            "measured:"
        )
    lines = [head, _("expect other times, the same ratios' direction and the same verdicts."), ""]
    for k in f.machine_cells:
        cell = by_index.get(k)
        first = cell.first_line[:70] if cell else ""
        seen = (
            _(" (stored: {seconds} s{room}; prints `{sample}`)").format(
                seconds=f"{cell.seconds:.1f}", room=_in_room(cell, run), sample=cell.sample[:80]
            )
            if cell and cell.sample
            else ""
        )
        lines.append(_("- cell {index}: `{code}`").format(index=k, code=first) + seen)
    return "\n".join(lines) + "\n"


def mistakes_section(lecture: int) -> str:
    """Return the notes' list of the mistakes the lecture's checks name, by exercise."""
    found = mistakes_of_lecture(lecture)
    if not found:
        return _("The checks of this lecture name no mistakes.") + "\n"
    lines = []
    for m in found:  # a check's message is its own catalogue entry: _() finds its translation
        if m.refused:  # a library call the check refuses: its hint is a message of its own
            text = _("calling {name}: {hint}").format(name=m.refused, hint=_(m.hint))
        else:
            text = _(m.text)
        text = text.replace("`", "'")
        exercise = m.exercise or _("any")
        lines.append(f"- **{exercise}**: `{text}`")
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


def generated_blocks(path: Path, lang: str = "en") -> dict[str, str]:
    """Return the generated blocks (name -> body) of one teaching document, in ``lang``."""
    path = Path(path)
    with speaking(lang):
        if path.name == "syllabus.md":
            facts = [lecture_facts(p) for p in lecture_notebooks().values()]
            return {"hours": hours_table(facts, read_room_times())}
        lecture = int(path.stem.removeprefix("lecture"))
        f = lecture_facts(lecture_notebooks()[lecture])
        run = read_room_times().get(lecture)
        return {
            "times": times_section(f, run),
            "machine": machine_section(f, run),
            "mistakes": mistakes_section(lecture),
        }


def render(root: Path = TEACHING) -> dict[Path, str]:
    """Return every teaching document with its generated blocks up to date (in English)."""
    out: dict[Path, str] = {}
    paths = [root / "syllabus.md"]
    paths += [root / "notes" / f"lecture{n:02d}.md" for n in lecture_notebooks()]
    for path in paths:
        if path.exists():
            text = path.read_text()
        else:
            n = int(path.stem.removeprefix("lecture"))
            text = _TEMPLATE.format(n=n, name=lecture_notebooks()[n].name)
        for name, body in generated_blocks(path).items():
            text = replace_generated(text, name, body)
        out[path] = text
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
