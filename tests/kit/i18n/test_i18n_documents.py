"""No lecture (the course in a second language): the README, the instructor's guide, the syllabus and the notes, translated paragraph by paragraph."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from course_kit.i18n import documents
from course_kit.i18n.catalogue import ROOT
from course_kit.teaching.generate import generated, generated_blocks

LANG = "ru"


@pytest.mark.parametrize("document", documents.DOCUMENTS)
def test_blocks_rebuild_the_document_exactly(document: str) -> None:
    text = (ROOT / document).read_text()
    assert "\n".join(block for block, _ in documents.split_blocks(text)) == text


@pytest.mark.parametrize("document", documents.DOCUMENTS)
def test_code_is_copied_and_generated_blocks_are_written_in_the_editions_language(
    document: str,
) -> None:
    edition = documents.translated_document_path(document, LANG)
    if not edition.exists():
        pytest.skip(f"{document} has no {LANG} edition yet (its catalogue is incomplete)")
    built = edition.read_text()
    for block, translatable in documents.split_blocks((ROOT / document).read_text()):
        if translatable or not block.strip():
            continue
        if block.startswith("<!-- generated: ") and document.startswith("docs/teaching/"):
            name = block.split()[2]
            body = generated_blocks(ROOT / document, LANG)[name]
            assert generated(built, name) == body.rstrip("\n") + "\n", f"{edition.name}: {name}"
            continue
        assert block in built, f"{edition.name}: a code or generated block is not copied"


def test_the_russian_notes_generated_blocks_are_in_russian() -> None:
    notes = documents.translated_document_path("docs/teaching/notes/lecture04.md", LANG)
    times, mistakes = (
        generated(notes.read_text(), "times"),
        generated(notes.read_text(), "mistakes"),
    )
    assert times.startswith("Сохранённый прогон:") and "- ячейка " in times, times[:200]
    # A check's message translated in the kit's catalogue is translated in the notes too.
    assert "отправил / получил" in mistakes and "sent / received" not in mistakes, mistakes[:400]


@pytest.fixture
def copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The docs (the syllabus links to the others' editions) and the syllabus's catalogue, in a scratch repository."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    po = "locale/ru/docs/teaching/syllabus.po"
    (tmp_path / po).parent.mkdir(parents=True)
    shutil.copy(ROOT / po, tmp_path / po)
    monkeypatch.setattr(documents, "ROOT", tmp_path)
    monkeypatch.setattr(documents, "DOCUMENTS", ["docs/teaching/syllabus.md"])
    return tmp_path


def test_a_changed_paragraph_fails_until_translated(copy: Path) -> None:
    assert documents.sync_documents(LANG, write=False).problems == []
    english = copy / "docs/teaching/syllabus.md"
    english.write_text(english.read_text().replace("A 15-week semester", "A 16-week semester"))
    problems = documents.sync_documents(LANG, write=False).problems
    assert problems and "lags the English" in problems[0]
    po = documents.update_document_catalogue("docs/teaching/syllabus.md", LANG)
    fuzzy = [entry for entry in po if entry.fuzzy]
    assert len(fuzzy) == 1 and "15-week" in fuzzy[0].previous_msgid  # the old translation kept
    assert "fuzzy" in documents.sync_documents(LANG, write=False).problems[0]
    with pytest.raises(ValueError, match="untranslated or fuzzy"):
        documents.build_document("docs/teaching/syllabus.md", LANG)


def test_a_hand_edited_edition_fails(copy: Path) -> None:
    edition = copy / "docs/ru/teaching/syllabus.md"
    edition.write_text(edition.read_text() + "\nещё строка\n")
    problems = documents.sync_documents(LANG, write=False).problems
    assert problems and "never edited by hand" in problems[0]
    documents.sync_documents(LANG, write=True)
    assert documents.sync_documents(LANG, write=False).problems == []
