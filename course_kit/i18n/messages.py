"""No lecture (the course in a second language): the kit's own messages (``_("…")`` in the library and the grader) extracted and merged into each language's catalogue with Babel.

``python -m course_kit.i18n messages``: ``pybabel extract`` writes the template (``.pot``) in ``locale/``
from the code, then ``pybabel update`` merges it into the ``.po`` in every ``locale/<lang>/LC_MESSAGES/``
(a message whose English changed keeps its translation, marked fuzzy, the previous English kept
beside it, as ``msgmerge`` does). The runtime is :mod:`course_lib.i18n`.
"""

from __future__ import annotations

from pathlib import Path

from course_kit.i18n.catalogue import ROOT
from course_lib.i18n import DOMAIN, LOCALE

__all__ = ["TEMPLATE", "extract_messages"]

TEMPLATE = LOCALE / f"{DOMAIN}.pot"


def extract_messages() -> list[str]:
    """Re-extract the kit's messages and merge them into every language; return the catalogues."""
    from babel.messages.frontend import CommandLineInterface

    common = ["--width", "10000", "--omit-header"]  # --no-wrap breaks --previous (Babel 2.19)
    CommandLineInterface().run(
        ["pybabel", "-q", "extract", "--no-location", "-k", "_", "-k", "N_", *common,
         "-o", str(TEMPLATE), str(ROOT / "course_lib"), str(ROOT / "course_grader"),
         str(ROOT / "course_kit" / "teaching")]
    )  # fmt: skip
    done = []
    for po in sorted(LOCALE.glob(f"*/LC_MESSAGES/{DOMAIN}.po")):
        lang = po.parent.parent.name
        CommandLineInterface().run(
            ["pybabel", "-q", "update", "-i", str(TEMPLATE), "-d", str(LOCALE), "-D", DOMAIN,
             "-l", lang, "--width", "10000", "--previous", "--ignore-obsolete"]
        )  # fmt: skip
        _tidy_header(po)
        done.append(po.relative_to(ROOT).as_posix())
    return done


def _tidy_header(path: Path) -> None:
    """Drop the placeholders Babel's update writes into the header (no names, no e-mails)."""
    import polib

    po = polib.pofile(str(path), wrapwidth=0)
    po.header = f"{DOMAIN}'s messages; extracted by pybabel (python -m course_kit.i18n messages)."
    po.metadata["Project-Id-Version"] = f"course-kit {DOMAIN}"
    for key in ("Report-Msgid-Bugs-To", "Last-Translator", "Language-Team"):
        po.metadata.pop(key, None)
    po.save()
