"""The translated editions (``notebooks/ru/``): code identical by construction, and a check that fails, naming the cell, when an English notebook moves without its catalogue."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from course_kit.i18n import catalogue, editions
from course_kit.i18n.catalogue import english_notebooks, translated_notebook_path, update_catalogue

LANG = "ru"


def _editions() -> list[tuple[Path, Path]]:
    pairs = [(n, translated_notebook_path(n, LANG)) for n in english_notebooks()]
    return [(n, t) for n, t in pairs if t.exists()]


def test_lecture_0_has_an_edition() -> None:
    """Lecture 0's catalogue is complete: its Russian edition exists, in the notebooks' language."""
    target = translated_notebook_path(catalogue.NOTEBOOKS / "00_cluster.ipynb", LANG)
    assert target.exists()
    assert json.loads(target.read_text())["metadata"]["language"] == LANG


@pytest.mark.parametrize("pair", _editions(), ids=lambda p: p[0].stem)
def test_every_code_cell_is_the_english_ones_byte_for_byte(pair: tuple[Path, Path]) -> None:
    english, translated = (json.loads(p.read_text())["cells"] for p in pair)
    code = [[(c["id"], "".join(c["source"])) for c in cells if c["cell_type"] == "code"]
            for cells in (english, translated)]  # fmt: skip
    assert code[0] == code[1]
    marked = [c for c in translated if c["cell_type"] == "markdown" and c["id"] != editions.NOTE_ID]
    assert len(marked) == sum(c["cell_type"] == "markdown" for c in english)


def test_the_check_passes_on_the_repository() -> None:
    """Every catalogue is current with its notebook, none fuzzy, every edition up to date."""
    report = editions.check(LANG)
    assert report.problems == []


@pytest.fixture
def copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of lecture 0, its catalogue, its edition and the glossaries, with the package pointed at it."""
    root = catalogue.ROOT
    for rel in ("notebooks/00_cluster.ipynb", "notebooks/ru/00_cluster.ipynb",
                "locale/ru/notebooks/00_cluster.po", "docs/teaching/glossary.md",
                "docs/teaching/glossary.ru.md"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, tmp_path / rel)
    (tmp_path / "notebooks" / "assignments").mkdir()
    for module in (catalogue, editions):
        monkeypatch.setattr(module, "ROOT", tmp_path)
        monkeypatch.setattr(module, "NOTEBOOKS", tmp_path / "notebooks")
    assert editions.check(LANG).problems == []
    return tmp_path


def _edit(path: Path, cell_id: str, change) -> None:  # noqa: ANN001 - a str -> str function
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.id == cell_id)
    cell.source = change(cell.source)
    nbformat.write(nb, path)


def test_a_changed_english_sentence_fails_the_check_naming_the_cell(copy: Path) -> None:
    english = copy / "notebooks" / "00_cluster.ipynb"
    _edit(english, "292eb02c", lambda s: s.replace("runs there", "runs over there"))
    problems = editions.check(LANG).problems
    assert problems == [
        "notebooks/00_cluster.ipynb cell 292eb02c: the English text changed since the catalogue "
        "was updated; run python -m course_kit.i18n update, then translate it"
    ]
    # The catalogue updated (as msgmerge): the translation kept, fuzzy, and still named.
    po = update_catalogue(english, LANG)
    assert next(e for e in po if e.msgctxt == "292eb02c").fuzzy
    (problem,) = editions.check(LANG).problems
    assert problem.startswith("notebooks/00_cluster.ipynb cell 292eb02c: its translation is fuzzy")
    assert not editions.build(LANG).built  # no edition from a fuzzy catalogue


def test_a_changed_code_cell_fails_until_the_edition_is_rebuilt(copy: Path) -> None:
    english = copy / "notebooks" / "00_cluster.ipynb"
    code = next(c for c in nbformat.read(english, as_version=4).cells if c.cell_type == "code")
    _edit(english, code.id, lambda s: s + "\n# one more line")
    (problem,) = editions.check(LANG).problems
    assert f"cell {code.id} (code) differs from notebooks/00_cluster.ipynb" in problem
    assert editions.build(LANG).built == ["notebooks/ru/00_cluster.ipynb"]
    assert editions.check(LANG).problems == []


def test_a_hand_edited_or_orphan_edition_fails(copy: Path) -> None:
    edition = copy / "notebooks" / "ru" / "00_cluster.ipynb"
    _edit(edition, "292eb02c", lambda s: s + " Правка вручную.")
    assert "cell 292eb02c (markdown) differs" in editions.check(LANG).problems[0]
    (copy / "notebooks" / "ru" / "99_extra.ipynb").write_text(edition.read_text())
    assert any("99_extra.ipynb: no complete catalogue" in p for p in editions.check(LANG).problems)


def test_links_point_one_folder_deeper_at_the_russian_glossary() -> None:
    target = translated_notebook_path(catalogue.NOTEBOOKS / "00_cluster.ipynb", LANG)
    first = json.loads(target.read_text())["cells"][0]
    assert "](../../docs/teaching/glossary.ru.md)" in "".join(first["source"])


def _outputs(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    texts = []
    for cell in (c for c in cells if c["cell_type"] == "code"):
        for out in cell.get("outputs", []):
            texts.append("".join(out.get("text", "")))
            texts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


@pytest.mark.parametrize("stem", editions.RUN_IN_CI[LANG])
def test_the_editions_run_in_ci_are_stored_executed(stem: str) -> None:
    """Their outputs are a run of the Russian notebook (build --execute), without the note."""
    english = next(n for n in english_notebooks() if n.stem == stem)
    target = translated_notebook_path(english, LANG)
    cells = json.loads(target.read_text())["cells"]
    assert not [c for c in cells if c.get("id") == editions.NOTE_ID]
    assert _outputs(target).strip()


def test_lecture_0_stored_with_the_kits_messages_in_russian() -> None:
    text = _outputs(translated_notebook_path(catalogue.NOTEBOOKS / "00_cluster.ipynb", LANG))
    assert "course_lib: локальных движков на этом компьютере: 4" in text
    assert "Упражнение 0.1 sum_of_squares_on_engines: НЕ ЗАЧТЕНО" in text
    assert "Exercise 0.1 sum_of_squares_on_engines" not in text
