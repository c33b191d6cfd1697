"""No lecture (the grader). Which assignments the grader judges, found from their folders: ``assignments/aN/probe.py`` defining ``aN_spec``.

Adding an assignment is adding its folder (:mod:`course_grader.assignments`); nothing here names
one. Kept apart from :mod:`course_grader.verdict.probe`, which the specs build on, so that the
imports run one way: ``registry`` -> ``assignments.aN.probe`` -> ``verdict.probe``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

import nbformat

from course_grader.cells import check_id
from course_grader.verdict.probe import ProbeSpec

__all__ = ["ASSIGNMENTS_FOLDER", "assignments", "probe_spec"]

#: The folder of the assignments' folders (``a1``, ``a2``, ...; each a package with a ``probe``).
ASSIGNMENTS_FOLDER = Path(__file__).resolve().parent / "assignments"
_FOLDER = re.compile(r"a(\d+)")


def assignments(folder: Path = ASSIGNMENTS_FOLDER) -> dict[str, Callable[[], ProbeSpec]]:
    """Return assignment ("A3") -> its probe spec's factory, for every ``aN`` folder with a probe."""
    found: dict[str, Callable[[], ProbeSpec]] = {}
    package = "course_grader.assignments" if folder == ASSIGNMENTS_FOLDER else None
    for sub in sorted(folder.iterdir(), key=lambda p: (len(p.name), p.name)):
        if not (_FOLDER.fullmatch(sub.name) and (sub / "probe.py").is_file()):
            continue
        module = importlib.import_module(f"{package or folder.name}.{sub.name}.probe")
        factory = getattr(module, f"{sub.name}_spec", None)
        if not callable(factory):
            raise TypeError(f"{module.__name__} defines no {sub.name}_spec(): add it")
        found[sub.name.upper()] = factory
    return found


def probe_spec(pristine: nbformat.NotebookNode) -> ProbeSpec:
    """Return the probe spec of this assignment; raise ``LookupError`` naming what is missing."""
    assignment = pristine.metadata.get("course", {}).get("assignment")
    factory = assignments().get(assignment)
    if factory is None:
        raise LookupError(
            f"no grader for assignment {assignment!r}: add course_grader/assignments/"
            f"{str(assignment).lower()}/probe.py defining {str(assignment).lower()}_spec()"
        )
    spec = factory()
    checks = {check_id(c) for c in pristine.cells if check_id(c) is not None}
    if checks != set(spec.exercises):
        raise LookupError(
            f"{assignment}'s notebook checks {sorted(checks)} but its probe judges "
            f"{sorted(spec.exercises)}: release the notebooks again (./kit release)"
        )
    return spec
