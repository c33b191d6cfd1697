"""No lecture (the course in a second language): the README, the instructor's guide, the syllabus and the notes, translated paragraph by paragraph."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from course_kit.i18n import documents
from course_kit.i18n.catalogue import ROOT

LANG = "ru"


@pytest.mark.parametrize("document", documents.DOCUMENTS)
def test_blocks_rebuild_the_document_exactly(document: str) -> None:
    text = (ROOT / document).read_text()
    assert "\n".join(block for block, _ in documents.split_blocks(text)) == text


@pytest.mark.parametrize("document", documents.DOCUMENTS)
def test_code_and_generated_blocks_are_copied_into_the_edition(document: str) -> None:
    edition = documents.translated_document_path(document, LANG)
    if not edition.exists():
        pytest.skip(f"{document} has no {LANG} edition yet (its catalogue is incomplete)")
    built = edition.read_text()
    for block, translatable in documents.split_blocks((ROOT / document).read_text()):
        if not translatable and block.strip():
            assert block in built, f"{edition.name}: a code or generated block is not copied"


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
