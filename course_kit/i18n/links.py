"""No lecture (the course in a second language): relative links of a translated notebook, rewritten for its folder one level deeper.

A link in ``notebooks/00_cluster.ipynb`` such as ``../docs/teaching/glossary.md`` would point
nowhere from ``notebooks/ru/00_cluster.ipynb``. Each relative target is resolved against the
English notebook, replaced by its edition in the language where one exists
(``glossary.md`` → ``glossary.ru.md``, ``README.md`` → ``README.ru.md``, a notebook →
``notebooks/ru/…``), and written relative to the translated notebook. URLs and ``#anchors`` stay.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

__all__ = ["edition", "rewrite_links"]

# Markdown ``[text](target "title")`` / ``![alt](target)``, and HTML ``src="…"`` / ``href="…"``.
_MARKDOWN = re.compile(r"(\]\()([^)\s]+)")
_HTML = re.compile(r"""((?:src|href)=["'])([^"']+)""")
_EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#|/)")


def edition(target: Path, lang: str, notebooks: Path) -> Path | None:
    """The ``lang`` edition of ``target`` if the repository has one, else None."""
    target = target.resolve()
    try:
        candidate = notebooks / lang / target.relative_to(notebooks)
    except ValueError:
        candidate = target.with_name(f"{target.stem}.{lang}{target.suffix}")
    return candidate if candidate.exists() else None


def rewrite_links(
    text: str,
    english_dir: Path,
    translated_dir: Path,
    find_edition: Callable[[Path], Path | None],
) -> str:
    """``text`` with every relative link re-pointed from ``translated_dir`` (to an edition if any)."""

    def fix(match: re.Match[str]) -> str:
        target = match.group(2)
        if _EXTERNAL.match(target):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        resolved = (english_dir / path).resolve()
        chosen = find_edition(resolved) or resolved
        new = Path(os.path.relpath(chosen, translated_dir)).as_posix()
        return match.group(1) + new + hash_ + anchor

    return _HTML.sub(fix, _MARKDOWN.sub(fix, text))
