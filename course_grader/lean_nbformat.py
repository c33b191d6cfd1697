"""No lecture (the grader). Import nbformat without the IRI grammar it never uses: about 1 s of CPU per process.

Importing ``jsonschema`` (nbformat's validator) builds ``rfc3987_syntax``'s Lark grammar, when
that package is installed, for the ``iri`` and ``iri-reference`` formats; nbformat's schemas use
neither, and its validation checks no format. Marking the package absent before the first
``import nbformat`` makes jsonschema skip those two formats (its import is in a
``suppress(ImportError)``), and nothing else changes: a malformed notebook is still refused
(``tests/grader/pipeline/test_lean_nbformat.py``). Every process that grades imports nbformat:
the grader, and nbval's process per run, which loads this module as a pytest plugin
(``-p course_grader.lean_nbformat``, before ``-p nbval.plugin``).
"""

from __future__ import annotations

import sys

__all__ = ["skip_iri_grammar"]

_GRAMMAR = "rfc3987_syntax"


def skip_iri_grammar() -> None:
    """Keep jsonschema from loading ``rfc3987_syntax`` in this process, if it has not yet."""
    # None in sys.modules makes ``import rfc3987_syntax`` raise ImportError, which jsonschema's
    # format module catches. Too late once jsonschema is imported: then it changes nothing.
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault(_GRAMMAR, None)  # type: ignore[arg-type]


# Loaded as a pytest plugin (``-p``), its import is what it does.
skip_iri_grammar()
