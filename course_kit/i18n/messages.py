"""No lecture (the course in a second language): the kit's own messages (``_("…")`` in the library and the grader) extracted and merged into each language's catalogue with Babel.

``python -m course_kit.i18n messages``: ``pybabel extract`` writes the template (``.pot``) in ``locale/``
from the code, then ``pybabel update`` merges it into the ``.po`` in every ``locale/<lang>/LC_MESSAGES/``
(a message whose English changed keeps its translation, marked fuzzy, the previous English kept
beside it, as ``msgmerge`` does). The runtime is :mod:`course_lib.i18n`.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from course_kit.i18n.catalogue import NOTEBOOKS, ROOT, save_catalogue
from course_lib.i18n import DOMAIN, LOCALE

__all__ = ["SOURCES", "TEMPLATE", "extract_messages", "extract_template", "stub_messages"]

TEMPLATE = LOCALE / f"{DOMAIN}.pot"
#: Where the kit's messages are written: the library, the grader, the teaching documents' generator,
#: the ./kit jobs (their help, usage and one-line errors).
SOURCES = ("course_lib", "course_grader", "course_kit/teaching", "course_kit/jobs")


def extract_template(template: Path = TEMPLATE) -> set[str]:
    """Write the kit's messages (the code's ``_()``/``N_()`` and the stubs' hints) to ``template``; return them."""
    from babel.messages.frontend import CommandLineInterface

    common = ["--width", "10000", "--omit-header"]  # --no-wrap breaks --previous (Babel 2.19)
    CommandLineInterface().run(
        ["pybabel", "-q", "extract", "--no-location", "-k", "_", "-k", "N_", *common,
         "-o", str(template), *(str(ROOT / part) for part in SOURCES)]
    )  # fmt: skip
    _add_stub_messages(template)
    import polib

    return {entry.msgid for entry in polib.pofile(str(template)) if entry.msgid}


def extract_messages() -> list[str]:
    """Re-extract the kit's messages and merge them into every language; return the catalogues."""
    from babel.messages.frontend import CommandLineInterface

    extract_template(TEMPLATE)
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


def _stubs_in(code: str) -> list[str]:
    """Return the messages of ``raise NotImplementedError("...")`` in a code cell (a stub's hint)."""
    lines = ["pass" if ln.lstrip().startswith(("%", "!")) else ln for ln in code.splitlines()]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    return [
        node.exc.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise)
        and isinstance(node.exc, ast.Call)
        and getattr(node.exc.func, "id", None) == "NotImplementedError"
        and node.exc.args
        and isinstance(node.exc.args[0], ast.Constant)
        and isinstance(node.exc.args[0].value, str)
    ]


def stub_messages() -> dict[str, str]:
    """Return {message: where} of every exercise stub in the students' notebooks (lectures, assignments)."""
    found: dict[str, str] = {}
    notebooks = [*sorted(NOTEBOOKS.glob("*.ipynb")), *sorted(NOTEBOOKS.glob("assignments/*.ipynb"))]
    for notebook in notebooks:
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                for message in _stubs_in("".join(cell["source"])):
                    found.setdefault(message, notebook.relative_to(ROOT).as_posix())
    return found


def _add_stub_messages(template: Path) -> None:
    """Add the stubs' messages to the template: code stays identical, the verdict translates them."""
    import polib

    pot = polib.pofile(str(template), wrapwidth=0)
    known = {entry.msgid for entry in pot}
    for message, where in stub_messages().items():
        if message not in known:
            pot.append(polib.POEntry(msgid=message, msgstr="", comment=f"stub in {where}"))
    save_catalogue(pot, template)


def _tidy_header(path: Path) -> None:
    """Drop the placeholders Babel's update writes into the header (no names, no e-mails)."""
    import polib

    po = polib.pofile(str(path), wrapwidth=0)
    po.header = f"{DOMAIN}'s messages; extracted by pybabel (python -m course_kit.i18n messages)."
    po.metadata["Project-Id-Version"] = f"course-kit {DOMAIN}"
    for key in ("Report-Msgid-Bugs-To", "Last-Translator", "Language-Team"):
        po.metadata.pop(key, None)
    save_catalogue(po, path)
