"""No lecture (the course in a second language): ``python -m course_kit.i18n update|messages|build|check|status [--lang ru]`` (= ``./kit i18n …``).

``update`` brings every catalogue up to date with the English notebooks (a changed cell's
translation turns fuzzy); ``messages`` does the same for the kit's own messages (Babel); ``build`` writes the editions of the notebooks whose catalogue is
complete (``--execute`` then runs those of :data:`~course_kit.i18n.editions.RUN_IN_CI` and stores
their outputs); ``check`` fails, one line per problem, when a catalogue lags its notebook, an entry
is fuzzy or an edition is stale, and names the notebooks still to translate; ``status`` counts.
"""

from __future__ import annotations

import argparse
import sys

import polib

from course_kit.i18n.catalogue import (
    ROOT,
    catalogue_path,
    english_notebooks,
    translated_notebook_path,
    untranslated,
    update_catalogue,
)
from course_kit.i18n.documents import DOCUMENTS, document_catalogue_path, update_document_catalogue
from course_kit.i18n.editions import RUN_IN_CI, build, check, execute
from course_kit.i18n.messages import extract_messages

__all__ = ["main"]


def _status(lang: str) -> int:
    for notebook in english_notebooks():
        path = catalogue_path(notebook, lang)
        if not path.exists():
            print(f"{path.relative_to(ROOT)}: missing (run update)")
            continue
        po = polib.pofile(str(path), wrapwidth=0)
        fuzzy = sum(1 for e in po if e.fuzzy)
        done = len(po) - len(untranslated(po))
        built = translated_notebook_path(notebook, lang).exists()
        extra = (f", {fuzzy} fuzzy" if fuzzy else "") + (", edition built" if built else "")
        print(f"{path.relative_to(ROOT)}: {done}/{len(po)} translated{extra}")
    for document in DOCUMENTS:
        path = document_catalogue_path(document, lang)
        if not path.exists():
            print(f"{path.relative_to(ROOT)}: missing (run update)")
            continue
        po = polib.pofile(str(path), wrapwidth=0)
        fuzzy = sum(1 for e in po if e.fuzzy)
        done = len(po) - len(untranslated(po))
        print(
            f"{path.relative_to(ROOT)}: {done}/{len(po)} translated"
            + (f", {fuzzy} fuzzy" if fuzzy else "")
        )
    return 0


def _check(lang: str, strict: bool) -> int:
    report = check(lang)
    for line in report.problems:
        print(f"i18n: {line}", file=sys.stderr)
    if report.incomplete:
        print(f"i18n: still to translate ({lang}): {', '.join(report.incomplete)}")
    if report.problems:
        return 1
    if strict and report.incomplete:
        print("i18n: --strict: every catalogue must be complete", file=sys.stderr)
        return 1
    print(f"i18n: every complete {lang} catalogue is current and its edition up to date")
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m course_kit.i18n") -> int:
    """Run one action; problems are printed one line each, without a traceback."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("action", choices=["update", "messages", "build", "check", "status"])
    parser.add_argument("notebooks", nargs="*", help="build: only these (stems, e.g. 00_cluster)")
    parser.add_argument("--lang", default="ru")
    parser.add_argument("--execute", action="store_true", help="build: run RUN_IN_CI's editions")
    parser.add_argument("--strict", action="store_true", help="check: fail on incomplete ones too")
    args = parser.parse_intermixed_args(argv)
    if args.lang not in {p.name for p in (ROOT / "locale").iterdir()}:
        print(
            f"i18n: no catalogues for {args.lang!r} under locale/; choose one there",
            file=sys.stderr,
        )
        return 2
    try:
        if args.action == "update":
            for notebook in english_notebooks():
                po = update_catalogue(notebook, args.lang)
                done = len(po) - len(untranslated(po))
                print(
                    f"{catalogue_path(notebook, args.lang).relative_to(ROOT)}: {done}/{len(po)} translated"
                )
            for document in DOCUMENTS:
                po = update_document_catalogue(document, args.lang)
                done = len(po) - len(untranslated(po))
                path = document_catalogue_path(document, args.lang).relative_to(ROOT)
                print(f"{path}: {done}/{len(po)} translated")
            return 0
        if args.action == "messages":
            for path in extract_messages():
                print(f"i18n: merged the kit's messages into {path}")
            return 0
        if args.action == "status":
            return _status(args.lang)
        if args.action == "build":
            report = build(args.lang, args.notebooks or None)
            for path in report.built:
                print(f"i18n: wrote {path}")
            if args.execute:
                stems = [
                    s
                    for s in RUN_IN_CI.get(args.lang, ())
                    if not args.notebooks or s in args.notebooks
                ]
                execute(args.lang, stems)
        return _check(args.lang, args.strict)
    except (ValueError, OSError) as exc:
        print(f"i18n: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - one line, as every job's errors
        print(f"i18n: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
