"""No lecture (the course in a second language): the translated notebooks (``notebooks/ru/…``) built from the English ones and their catalogues, and the check that nothing drifted.

Only notebooks whose catalogue is complete (every entry translated, none fuzzy) get an edition.
Code cells are copied byte for byte. Outputs: a notebook named in :data:`RUN_IN_CI` is stored
executed (``build --execute``: the Russian notebook run with ``COURSE_LANG=ru``, so the kit's
messages in its outputs are Russian; the test command runs it under nbval); every other edition is
stored with its outputs cleared and a note under its title saying so. Whether an edition is up to
date is judged on everything but outputs, so storing a run's outputs never makes it stale.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import polib

from course_kit.i18n.catalogue import (
    NOTEBOOKS,
    ROOT,
    catalogue_path,
    english_notebooks,
    translated_notebook_path,
    untranslated,
)
from course_kit.i18n.documents import ROOT as DOCUMENT_ROOT
from course_kit.i18n.documents import sync_documents
from course_kit.i18n.links import edition, rewrite_links
from course_lib.files import atomic_write_text

__all__ = [
    "NOTE_ID",
    "RUN_IN_CI",
    "Report",
    "build",
    "check",
    "edition_of",
    "execute",
    "is_complete",
]

#: Editions stored executed and run under nbval by the test command (stems of the English notebooks).
RUN_IN_CI: dict[str, tuple[str, ...]] = {"ru": ("00_cluster", "04_data_parallel", "A1_sgd_conv")}
#: The id of the note cell an edition without stored outputs carries under its title.
NOTE_ID = "i18n-outputs-note"
NOTES = {
    "ru": "*Это издание блокнота создано из английского оригинала и каталога перевода; выводы "
    "ячеек в нём не сохранены. Запустите блокнот (Run → Run All Cells), и они появятся — "
    "с сообщениями курса на русском языке.*"
}


def _short(path: Path) -> str:
    for root in (ROOT, DOCUMENT_ROOT):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return path.as_posix()


def _catalogue(notebook: Path, lang: str) -> polib.POFile | None:
    path = catalogue_path(notebook, lang)
    return polib.pofile(str(path), wrapwidth=0) if path.exists() else None


def is_complete(notebook: Path, lang: str) -> bool:
    """Whether every markdown cell of ``notebook`` has a current, non-fuzzy translation."""
    po = _catalogue(notebook, lang)
    return po is not None and not untranslated(po) and not drift(notebook, po)


def drift(notebook: Path, po: polib.POFile) -> list[str]:
    """One line per markdown cell whose English text the catalogue does not hold (changed, new, gone)."""
    nb = nbformat.read(notebook, as_version=4)
    cells = {c.id: c.source for c in nb.cells if c.cell_type == "markdown"}
    entries = {e.msgctxt: e.msgid for e in po}
    name = _short(notebook)
    lines = [
        f"{name} cell {cid}: the English text changed since the catalogue was updated"
        for cid, text in cells.items()
        if cid in entries and entries[cid] != text
    ]
    lines += [
        f"{name} cell {cid}: a new markdown cell, not in the catalogue"
        for cid in cells
        if cid not in entries
    ]
    lines += [
        f"{name} cell {cid}: in the catalogue, no longer in the notebook"
        for cid in entries
        if cid not in cells
    ]
    return lines


def edition_of(target: Path, lang: str) -> Path | None:
    """Where a link to ``target`` points in ``lang``: its edition when one exists or will be built."""
    target = target.resolve()
    if target.suffix == ".ipynb" and NOTEBOOKS in target.parents and target.exists():
        return translated_notebook_path(target, lang) if is_complete(target, lang) else None
    return edition(target, lang, NOTEBOOKS)


def translate(notebook: Path, lang: str) -> nbformat.NotebookNode:
    """The edition of ``notebook`` in ``lang`` without outputs (catalogue complete and current)."""
    po = _catalogue(notebook, lang)
    if po is None or untranslated(po) or drift(notebook, po):
        raise ValueError(f"{_short(notebook)}: its {lang} catalogue is incomplete or out of date")
    by_id = {e.msgctxt: e.msgstr for e in po}
    out = copy.deepcopy(nbformat.read(notebook, as_version=4))
    target = translated_notebook_path(notebook, lang)
    for cell in out.cells:
        if cell.cell_type == "markdown":
            cell.source = rewrite_links(
                by_id[cell.id], notebook.parent, target.parent, lambda p: edition_of(p, lang)
            )
        elif cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    out.metadata["language"] = lang
    out.metadata.pop("widgets", None)  # the English run's widget state: outputs, as above
    return out


def _with_note(nb: nbformat.NotebookNode, lang: str) -> nbformat.NotebookNode:
    note = nbformat.v4.new_markdown_cell(NOTES[lang])
    note.id = NOTE_ID
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, note)
    return nb


def _comparable(nb: nbformat.NotebookNode) -> str:
    """The notebook as JSON without outputs, execution counts, widget state and the outputs note."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)  # a run's widget state is output
    nb.cells = [c for c in nb.cells if c.get("id") != NOTE_ID]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.get("metadata", {}).pop("execution", None)
    return json.dumps(nb, sort_keys=True, ensure_ascii=False)


def _stale_cell(stored: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> str | None:
    """None when ``stored`` is ``fresh`` but for outputs, else which cell (or part) differs."""
    if _comparable(stored) == _comparable(fresh):
        return None
    kept = [c for c in stored.cells if c.get("id") != NOTE_ID]
    for old, new in zip(kept, fresh.cells, strict=False):
        if (old.get("id"), old.cell_type, old.source) != (new.get("id"), new.cell_type, new.source):
            return f"cell {new.get('id')} ({new.cell_type})"
    return "the cell list" if len(kept) != len(fresh.cells) else "the metadata"


def _stored_executed(notebook: Path, lang: str) -> bool:
    return notebook.stem in RUN_IN_CI.get(lang, ())


@dataclass
class Report:
    """What ``check`` found: problems (each fails it) and the notebooks still to translate."""

    problems: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    built: list[str] = field(default_factory=list)


def build(lang: str, only: list[str] | None = None) -> Report:
    """Write the edition of every notebook whose catalogue is complete; leave current ones alone."""
    report = Report()
    for notebook in english_notebooks():
        if only and notebook.stem not in only:
            continue
        if not is_complete(notebook, lang):
            continue
        target = translated_notebook_path(notebook, lang)
        fresh = translate(notebook, lang)
        if target.exists() and _comparable(nbformat.read(target, as_version=4)) == _comparable(
            fresh
        ):
            continue
        if not _stored_executed(notebook, lang):
            fresh = _with_note(fresh, lang)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, nbformat.writes(fresh) + "\n")
        report.built.append(_short(target))
    if not only:
        # Twice: a document links to the editions of others, which the first pass may have created.
        sync_documents(lang, write=True)
        found = sync_documents(lang, write=True)
        report.problems += found.problems
        report.incomplete += found.incomplete
        report.built += found.built
    return report


def check(lang: str) -> Report:
    """Every catalogue current and not fuzzy, every complete notebook's edition up to date."""
    report = Report()
    expected = set()
    for notebook in english_notebooks():
        po = _catalogue(notebook, lang)
        if po is None:
            report.problems.append(
                f"{_short(notebook)}: no {lang} catalogue; run python -m course_kit.i18n update"
            )
            continue
        moved = drift(notebook, po)
        report.problems += [
            f"{line}; run python -m course_kit.i18n update, then translate it" for line in moved
        ]
        fuzzy = [e.msgctxt for e in po if e.fuzzy]
        report.problems += [
            f"{_short(notebook)} cell {cid}: its translation is fuzzy (the English changed); "
            f"revise it in {_short(catalogue_path(notebook, lang))} and drop the fuzzy flag"
            for cid in fuzzy
        ]
        target = translated_notebook_path(notebook, lang)
        if moved or untranslated(po):
            if moved or fuzzy:  # its edition is stale: the lines above say why
                expected.add(target)
            else:
                left = len(untranslated(po))
                report.incomplete.append(f"{_short(notebook)} ({len(po) - left}/{len(po)})")
            continue
        expected.add(target)
        if not target.exists():
            report.problems.append(
                f"{_short(target)}: missing; run python -m course_kit.i18n build"
            )
        else:
            stale = _stale_cell(nbformat.read(target, as_version=4), translate(notebook, lang))
            if stale is not None:
                report.problems.append(
                    f"{_short(target)}: {stale} differs from {_short(notebook)} and its "
                    "catalogue; run python -m course_kit.i18n build"
                )
    report.problems += (found := sync_documents(lang, write=False)).problems
    report.incomplete += found.incomplete
    for stray in sorted((NOTEBOOKS / lang).rglob("*.ipynb")) if (NOTEBOOKS / lang).exists() else []:
        if stray not in expected and ".ipynb_checkpoints" not in stray.parts:
            report.problems.append(
                f"{_short(stray)}: no complete catalogue behind it (translations are generated, "
                "never edited by hand); delete it or complete its catalogue"
            )
    return report


def execute(lang: str, stems: list[str]) -> None:
    """Run editions top to bottom in ``lang`` and store their outputs (nbconvert, in place)."""
    env = dict(os.environ, COURSE_LANG=lang, PYTHONPATH=str(ROOT))
    for stem in stems:
        matches = [n for n in english_notebooks() if n.stem == stem]
        if not matches or not translated_notebook_path(matches[0], lang).exists():
            raise ValueError(f"no {lang} edition of {stem}: complete its catalogue and build first")
        target = translated_notebook_path(matches[0], lang)
        subprocess.run(
            [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
             "--inplace", "--ExecutePreprocessor.timeout=600", target.name],
            cwd=target.parent, env=env, check=True,
        )  # fmt: skip
