"""No lecture (the course in a second language): a notebook's prose as a gettext catalogue, (the translated notebook is built by :mod:`~course_kit.i18n.editions`).

The English notebook is the only source. Each markdown cell is one message: ``msgctxt`` is the
cell's id, ``msgid`` its English text. When the English text of a cell changes, its translation is
kept but marked fuzzy (with the previous English text beside it), as gettext's ``msgmerge`` does,
so a translator sees what changed; no edition is built while an entry is fuzzy or empty. Code cells are never
in a catalogue: the translated notebook copies them, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import polib

__all__ = [
    "save_catalogue",
    "ROOT",
    "catalogue_path",
    "english_notebooks",
    "translated_notebook_path",
    "update_catalogue",
    "untranslated",
]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def english_notebooks() -> list[Path]:
    """Every English lecture and assignment notebook, in course order."""
    lectures = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assignments = sorted((NOTEBOOKS / "assignments").glob("A*.ipynb"))
    return lectures + assignments


def catalogue_path(notebook: Path, lang: str) -> Path:
    """Where the catalogue of ``notebook`` in ``lang`` lives (``locale/ru/notebooks/…/X.po``)."""
    relative = notebook.resolve().relative_to(NOTEBOOKS)
    return ROOT / "locale" / lang / "notebooks" / relative.with_suffix(".po")


def translated_notebook_path(notebook: Path, lang: str) -> Path:
    """Where the generated notebook in ``lang`` is written (``notebooks/ru/…``)."""
    relative = notebook.resolve().relative_to(NOTEBOOKS)
    return NOTEBOOKS / lang / relative


def _header(notebook: Path, lang: str) -> dict[str, str]:
    return {
        "Project-Id-Version": f"course-kit {notebook.relative_to(ROOT).as_posix()}",
        "Language": lang,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
        "Plural-Forms": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && "
        "(n%100<10 || n%100>=20) ? 1 : 2);",
    }


def update_catalogue(notebook: Path, lang: str) -> polib.POFile:
    """Bring the catalogue of ``notebook`` up to date with its markdown cells; keep translations."""
    path = catalogue_path(notebook, lang)
    old = polib.pofile(str(path)) if path.exists() else None
    previous = {entry.msgctxt: entry for entry in old} if old is not None else {}
    po = polib.POFile(wrapwidth=0)
    po.metadata = _header(notebook, lang)
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        entry = polib.POEntry(msgctxt=cell.id, msgid=cell.source, msgstr="")
        before = previous.get(cell.id)
        if before is not None and before.msgstr:
            entry.msgstr = before.msgstr
            if before.msgid != cell.source:
                # As msgmerge does: the old translation stays, marked for review, old text beside it.
                entry.flags.append("fuzzy")
                entry.previous_msgid = before.previous_msgid or before.msgid
            elif before.fuzzy:
                entry.flags.append("fuzzy")
                entry.previous_msgid = before.previous_msgid
        po.append(entry)
    save_catalogue(po, path)
    return po


def save_catalogue(po: polib.POFile, path: Path) -> None:
    """Write ``po`` to ``path`` atomically (a catalogue is never left half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    po.save(str(tmp))
    tmp.replace(path)


def untranslated(po: polib.POFile) -> list[str]:
    """The ids of the cells whose translation is missing or fuzzy."""
    return [entry.msgctxt for entry in po if not entry.msgstr or entry.fuzzy]
