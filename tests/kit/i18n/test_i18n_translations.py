"""The quality bar of every Russian catalogue: the glossary's terms, formulas, inline code and numbers untouched, the kit's messages current with the code."""

from __future__ import annotations

import re
from pathlib import Path

import polib
import pytest

from course_kit.i18n.catalogue import ROOT
from course_kit.i18n.messages import extract_template
from course_lib.i18n import DOMAIN

LOCALE = ROOT / "locale" / "ru"
GLOSSARY = ROOT / "docs" / "teaching" / "glossary.ru.md"
CATALOGUES = sorted(LOCALE.rglob("*.po"))
MESSAGES = LOCALE / "LC_MESSAGES" / f"{DOMAIN}.po"
_WORD = "[0-9a-zа-яё-]"


def avoided_variants() -> dict[str, str]:
    """Each variant the glossary's «не используем» column lists, as a regex -> its English term."""
    out = {}
    for line in GLOSSARY.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("English", "---") or not cells[2]:
            continue
        for variant in cells[2].split(","):
            body = r"\s+".join(re.escape(w).replace("…", f"{_WORD}*") for w in variant.split())
            out[rf"(?<!{_WORD}){body}(?!{_WORD})"] = cells[0]
    return out


def translated(path: Path) -> list[polib.POEntry]:
    return [e for e in polib.pofile(str(path)) if e.msgstr]


def test_the_glossary_lists_variants_and_the_matching_works() -> None:
    variants = avoided_variants()
    assert len(variants) > 40
    hits = [term for rx, term in variants.items() if re.search(rx, "два двигателя и Кит", re.I)]
    assert sorted(hits) == ["engine (ipyparallel)", "the kit"]
    assert not [rx for rx in variants if re.search(rx, "китайский ноутбук, блокнот", re.I)]


@pytest.mark.parametrize("path", CATALOGUES, ids=lambda p: p.relative_to(LOCALE).as_posix())
def test_glossary_terms_used_consistently(path: Path) -> None:
    """A translation that uses a variant the glossary rules out fails, naming the cell and term."""
    variants = avoided_variants()
    wrong = [
        f"{e.msgctxt or e.msgid[:40]!r}: {m.group(0)!r} (glossary: {term})"
        for e in translated(path)
        for rx, term in variants.items()
        if (m := re.search(rx, e.msgstr, re.I))
    ]
    assert not wrong, f"{path.relative_to(ROOT)}: not the glossary's term:\n" + "\n".join(wrong)


def untouchable(text: str) -> list[str]:
    """The formulas, inline code spans, link targets and numbers a translation must keep as written.

    Spans may run over a line break (the translation may break its lines elsewhere): whitespace
    is compared collapsed.
    """
    spans_rx = r"```.*?```|\$\$.+?\$\$|\$[^$]+?\$|``[^`].*?``|`[^`]+`|\]\([^)\s]+\)"
    spans = [" ".join(s.split()) for s in re.findall(spans_rx, text, re.S)]
    # An anchor names a heading, which the translation translates; a link to the other language's
    # edition (README.ru.md) becomes a link back to the English one. Both legitimately change.
    spans = [s for s in spans if not re.fullmatch(r"\]\((#.*|[^)]*\.ru\.md)\)", s)]
    rest = re.sub(spans_rx + r"|\{[a-z_]+\}", " ", text, flags=re.S)
    numbers = re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w])", rest)
    return spans + numbers


@pytest.mark.parametrize("path", CATALOGUES, ids=lambda p: p.relative_to(LOCALE).as_posix())
def test_formulas_code_and_numbers_kept(path: Path) -> None:
    missing = []
    for e in translated(path):
        left = " ".join(e.msgstr.split())
        for span in untouchable(e.msgid):
            if span not in left:
                missing.append(f"{e.msgctxt or e.msgid[:40]!r}: {span!r}")
    assert not missing, f"{path.relative_to(ROOT)}: changed or dropped:\n" + "\n".join(missing)


def test_messages_keep_their_placeholders() -> None:
    po = MESSAGES
    fields = re.compile(r"\{[a-z_]*\}")
    wrong = [
        e.msgid
        for e in translated(po)
        if sorted(fields.findall(e.msgid)) != sorted(fields.findall(e.msgstr))
    ]
    assert not wrong


def test_the_kits_messages_are_translated_and_current_with_the_code(tmp_path: Path) -> None:
    """Every ``_("…")`` of the library, the grader and the generator, and every stub's hint, is translated."""
    in_code = extract_template(tmp_path / f"{DOMAIN}.pot")
    po = polib.pofile(str(MESSAGES))
    done = {e.msgid for e in po if e.msgstr and not e.fuzzy}
    assert in_code - done == set(), "run python -m course_kit.i18n messages, then translate these"
