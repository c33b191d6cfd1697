"""No lecture (the course in a second language): ``python -m course_kit.i18n update|status [--lang ru]``."""

from __future__ import annotations

import argparse
import sys

from course_kit.i18n.catalogue import (
    ROOT,
    catalogue_path,
    english_notebooks,
    untranslated,
    update_catalogue,
)
from course_kit.i18n.documents import DOCUMENTS, document_catalogue_path, update_document_catalogue


def main(argv: list[str] | None = None) -> int:
    """Update every notebook's and document's catalogue, and say how much of each is translated."""
    parser = argparse.ArgumentParser(prog="python -m course_kit.i18n")
    parser.add_argument("action", choices=["update", "status"])
    parser.add_argument("--lang", default="ru")
    args = parser.parse_args(argv)
    for notebook in english_notebooks():
        po = update_catalogue(notebook, args.lang)
        left = untranslated(po)
        print(
            f"{catalogue_path(notebook, args.lang).relative_to(ROOT)}: {len(po) - len(left)}/{len(po)} translated"
        )
    for document in DOCUMENTS:
        po = update_document_catalogue(document, args.lang)
        left = untranslated(po)
        path = document_catalogue_path(document, args.lang).relative_to(ROOT)
        print(f"{path}: {len(po) - len(left)}/{len(po)} translated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
