"""No lecture (the course in a second language): a Markdown document's prose as a gettext catalogue, and the translated document built from it.

The English document is the only source. It is cut into blocks at blank lines; each block of prose
(a paragraph, a heading, a list, a table) is one message, keyed by its English text, as gettext
keys a program's strings. Fenced code blocks are copied unchanged; the blocks a generator writes
(between ``<!-- generated: … -->`` and ``<!-- end generated -->``: cell times, the checks' own
messages) are written again by the generator in the document's language (its templates and the
checks' messages are the kit's messages, translated in its catalogue). ``README.md`` becomes ``README.ru.md``; ``docs/X.md`` becomes ``docs/ru/X.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polib

from course_kit.i18n import catalogue
from course_kit.i18n.catalogue import ROOT, _header, save_catalogue, untranslated
from course_kit.i18n.links import edition, rewrite_links
from course_kit.teaching.generate import generated_blocks, replace_generated
from course_lib.files import atomic_write_text

__all__ = [
    "DOCUMENTS",
    "split_blocks",
    "document_catalogue_path",
    "translated_document_path",
    "update_document_catalogue",
    "build_document",
    "sync_documents",
    "SyncReport",
]

#: The documents translated, relative to the repository root.
DOCUMENTS = [
    "README.md",
    "docs/instructor.md",
    "docs/teaching/syllabus.md",
    *[f"docs/teaching/notes/lecture{n:02d}.md" for n in range(16)],
]

_FENCE = re.compile(r"^\s*(```|~~~)")
_GENERATED = re.compile(r"^<!-- generated: ")
_END_GENERATED = "<!-- end generated -->"


def split_blocks(text: str) -> list[tuple[str, bool]]:
    """The document as ``(block, translatable)`` pairs; joining the blocks with blank lines rebuilds it."""
    lines = text.split("\n")
    blocks: list[tuple[str, bool]] = []
    current: list[str] = []
    i = 0

    def flush() -> None:
        if current:
            block = "\n".join(current)
            blocks.append((block, bool(re.search(r"[A-Za-z]", block))))
            current.clear()

    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line) or _GENERATED.match(line):
            flush()
            fenced = bool(_FENCE.match(line))
            closing = _FENCE.match(line).group(1) if fenced else None
            verbatim = [line]
            i += 1
            while i < len(lines):
                verbatim.append(lines[i])
                if (fenced and lines[i].strip().startswith(closing)) or (
                    not fenced and lines[i].strip() == _END_GENERATED
                ):
                    break
                i += 1
            blocks.append(("\n".join(verbatim), False))
            i += 1
            continue
        if line.strip() == "":
            flush()
            blocks.append(("", False))
        else:
            current.append(line)
        i += 1
    flush()
    return blocks


def document_catalogue_path(document: str, lang: str) -> Path:
    """Where the catalogue of ``document`` lives (``locale/ru/docs/instructor.po``)."""
    return ROOT / "locale" / lang / Path(document).with_suffix(".po")


def translated_document_path(document: str, lang: str) -> Path:
    """Where the document in ``lang`` is written: ``README.ru.md``, ``docs/ru/…``."""
    path = Path(document)
    if path.parts[0] == "docs":
        return ROOT / "docs" / lang / Path(*path.parts[1:])
    return ROOT / path.with_suffix(f".{lang}.md")


def update_document_catalogue(document: str, lang: str) -> polib.POFile:
    """Bring the catalogue of ``document`` up to date with its prose blocks; keep translations."""
    path = document_catalogue_path(document, lang)
    old = polib.pofile(str(path)) if path.exists() else None
    kept = {entry.msgid: entry for entry in old} if old is not None else {}
    olds = [entry for entry in old if entry.msgstr] if old is not None else []
    po = polib.POFile(wrapwidth=0)
    po.metadata = _header(catalogue.ROOT / document, lang)  # the name, not the file
    seen: set[str] = set()
    text = (ROOT / document).read_text(encoding="utf-8")
    for block, translatable in split_blocks(text):
        if not translatable or block in seen:
            continue
        seen.add(block)
        entry = polib.POEntry(msgid=block, msgstr="")
        before = kept.get(block)
        if before is not None and before.msgstr:
            entry.msgstr = before.msgstr
            if before.fuzzy:
                entry.flags.append("fuzzy")
                entry.previous_msgid = before.previous_msgid
        else:
            similar = _most_similar(block, olds, seen_ids={e.msgid for e in po})
            if similar is not None:
                # msgmerge's fuzzy matching: a changed paragraph keeps its old translation, flagged.
                entry.msgstr = similar.msgstr
                entry.flags.append("fuzzy")
                entry.previous_msgid = similar.msgid
        po.append(entry)
    save_catalogue(po, path)
    return po


def _most_similar(
    block: str, olds: list[polib.POEntry], seen_ids: set[str]
) -> polib.POEntry | None:
    """The old entry closest to ``block`` (difflib ratio ≥ 0.6), as msgmerge finds a fuzzy match."""
    import difflib

    best, best_ratio = None, 0.6
    for entry in olds:
        if entry.msgid in seen_ids:
            continue
        matcher = difflib.SequenceMatcher(None, block, entry.msgid, autojunk=False)
        if matcher.real_quick_ratio() < best_ratio or matcher.quick_ratio() < best_ratio:
            continue
        ratio = matcher.ratio()
        if ratio >= best_ratio:
            best, best_ratio = entry, ratio
    return best


def _find_edition(source: Path, lang: str):
    """The Russian edition a link of ``source`` should point at (a document, a notebook, ``X.ru.md``)."""

    def find(target: Path) -> Path | None:
        if target == source.resolve():
            return None  # a link to the English original (the editions' "English version" line)
        try:
            relative = target.relative_to(ROOT).as_posix()
        except ValueError:
            return None
        if relative in DOCUMENTS or relative.startswith("docs/"):
            candidate = translated_document_path(relative, lang)
            if candidate.exists():
                return candidate
        return edition(target, lang, ROOT / "notebooks")

    return find


def sync_documents(lang: str, write: bool) -> SyncReport:
    """Each document's catalogue current and complete, its edition built from it (or, not writing, checked)."""
    report = SyncReport()
    for document in DOCUMENTS:
        path = document_catalogue_path(document, lang)
        if not path.exists():
            report.incomplete.append(f"{document} (no catalogue: run update)")
            continue
        po = polib.pofile(str(path), wrapwidth=0)
        blocks = {
            block
            for block, translatable in split_blocks((ROOT / document).read_text())
            if translatable
        }
        if blocks != {entry.msgid for entry in po}:
            report.problems.append(
                f"{document}: its catalogue lags the English; run python -m course_kit.i18n update, "
                "then translate the new or fuzzy blocks"
            )
            continue
        fuzzy = sum(1 for entry in po if entry.fuzzy)
        if fuzzy:
            report.problems.append(
                f"{document}: {fuzzy} fuzzy blocks in {_rel(path)} (the English changed); "
                "revise them and drop the fuzzy flag"
            )
            continue
        left = len(untranslated(po))
        if left:
            report.incomplete.append(f"{document} ({len(po) - left}/{len(po)})")
            continue
        target = translated_document_path(document, lang)
        text = build_document(document, lang)
        if target.exists() and target.read_text() == text:
            continue
        if write:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(target, text)
            report.built.append(_rel(target))
        else:
            report.problems.append(
                f"{_rel(target)}: differs from {document} and its catalogue (translations are "
                "generated, never edited by hand); run python -m course_kit.i18n build"
            )
    return report


@dataclass
class SyncReport:
    """What :func:`sync_documents` found: problems, documents still to translate, editions written."""

    problems: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    built: list[str] = field(default_factory=list)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def build_document(document: str, lang: str) -> str:
    """The document in ``lang``: prose from the catalogue, code copied, generated blocks in ``lang``."""
    path = document_catalogue_path(document, lang)
    po = polib.pofile(str(path))
    by_id = {entry.msgid: entry for entry in po}
    text = (ROOT / document).read_text(encoding="utf-8")
    out: list[str] = []
    for block, translatable in split_blocks(text):
        if not translatable:
            out.append(block)
            continue
        entry = by_id.get(block)
        if entry is None:
            raise ValueError(f"{path.relative_to(ROOT)}: catalogue out of date; run update")
        if not entry.msgstr or entry.fuzzy:
            first = block.splitlines()[0][:60]
            raise ValueError(
                f"{path.relative_to(ROOT)}: untranslated or fuzzy: {first!r}; translate it, then build"
            )
        out.append(entry.msgstr)
    target = translated_document_path(document, lang)
    text = "\n".join(out)  # blank-line separators are blocks of their own: the original spacing
    if document.startswith("docs/teaching/"):  # the generator's blocks, written in ``lang``
        for name, body in generated_blocks(ROOT / document, lang).items():
            text = replace_generated(text, name, body)
    return rewrite_links(
        text, (ROOT / document).parent, target.parent, _find_edition(ROOT / document, lang)
    )
