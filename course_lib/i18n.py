"""No lecture (the course in a second language): the kit's messages in the student's language, ``_("…")``.

English is the source and the default: ``_(text)`` returns ``text`` itself unless the language is
one with a catalogue (the domain's ``.po`` in ``locale/<lang>/LC_MESSAGES/``, extracted from the code by
Babel's ``pybabel extract``; see ``docs/instructor.md``). The language is, first, ``COURSE_LANG``
(``ru``, ``ru_RU.UTF-8``); else the translated notebook being run: a kernel's working directory,
or JupyterLab's ``JPY_SESSION_NAME``, inside ``notebooks/<lang>/`` (the generated editions, whose
metadata says ``language: <lang>``). Messages with values are templates: ``_("{n} engines").format(n=4)``.
The grader speaks a submission's language for the length of its grading (:func:`speaking`), in its
own process, whatever the environment says.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DOMAIN", "LOCALE", "N_", "_", "known_language", "language", "speaking"]

LOCALE = Path(__file__).resolve().parents[1] / "locale"
DOMAIN = "course_lib"


def _catalogue_path(lang: str) -> Path:
    return LOCALE / lang / "LC_MESSAGES" / f"{DOMAIN}.po"


def _from_path(path: str) -> str | None:
    """The language of a notebook or folder under ``notebooks/<lang>/``, if it has a catalogue."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part == "notebooks" and _catalogue_path(parts[i + 1]).exists():
            return parts[i + 1]
    return None


_SPOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("course_lang", default=None)


def known_language(lang: object) -> str:
    """Return ``lang`` if the kit has its catalogue (or it is ``en``), else ``en``."""
    if (
        isinstance(lang, str)
        and lang.isalpha()
        and (lang == "en" or _catalogue_path(lang).exists())
    ):
        return lang
    return "en"


@contextlib.contextmanager
def speaking(lang: object) -> Iterator[str]:
    """Speak ``lang`` (one with a catalogue, else English) inside the ``with``; yield the language."""
    token = _SPOKEN.set(known_language(lang))
    try:
        yield _SPOKEN.get() or "en"
    finally:
        _SPOKEN.reset(token)


def language() -> str:
    """The language the kit speaks now: :func:`speaking`'s, ``COURSE_LANG``, a translated notebook's, or ``en``."""
    spoken = _SPOKEN.get()
    if spoken is not None:
        return spoken
    chosen = os.environ.get("COURSE_LANG", "").strip()
    if chosen:
        return chosen.split(".")[0].split("_")[0].lower() or "en"
    for where in (os.environ.get("JPY_SESSION_NAME", ""), _cwd()):
        lang = _from_path(where) if where else None
        if lang:
            return lang
    return "en"


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # a deleted working directory
        return ""


@functools.lru_cache(maxsize=4)
def _messages(lang: str) -> dict[str, str]:
    """msgid → msgstr of ``lang``'s catalogue, translated and not fuzzy entries only."""
    path = _catalogue_path(lang)
    if lang == "en" or not path.exists():
        return {}
    try:
        import polib  # only where a translation is asked for
    except ImportError:  # ./kit help before ./kit setup (a fresh clone's python3): English
        return {}

    po = polib.pofile(str(path))
    return {e.msgid: e.msgstr for e in po if e.msgstr and not e.fuzzy and not e.obsolete}


def N_(message: str) -> str:  # noqa: N802 - gettext's name for "translate later"
    """Mark ``message`` for the catalogue and return it unchanged (translated where it is shown)."""
    return message


def _(message: str) -> str:
    """``message`` in the current language (itself in English or when not translated)."""
    return _messages(language()).get(message, message)
