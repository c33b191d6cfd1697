"""Which assignments the grader judges itself (A1-A8), and their probe specs.

Kept apart from :mod:`course_lib.grading.probes.core`, which the specs build on, so that the
imports run one way: ``registry`` -> ``a1`` ... ``a8`` -> ``core``.
"""

from __future__ import annotations

from collections.abc import Callable

import nbformat

from course_lib.grading.cells import check_id
from course_lib.grading.probes.a1 import a1_spec
from course_lib.grading.probes.a2 import a2_spec
from course_lib.grading.probes.a3 import a3_spec
from course_lib.grading.probes.a4 import a4_spec
from course_lib.grading.probes.a5 import a5_spec
from course_lib.grading.probes.a6 import a6_spec
from course_lib.grading.probes.a7 import a7_spec
from course_lib.grading.probes.a8 import a8_spec
from course_lib.grading.probes.core import ProbeSpec

__all__ = ["CONVERTED", "probe_spec"]

#: Assignments whose verdicts the grader decides; the others still check inside the kernel.
CONVERTED: dict[str, Callable[[], ProbeSpec]] = {
    "A1": a1_spec,
    "A2": a2_spec,
    "A3": a3_spec,
    "A4": a4_spec,
    "A5": a5_spec,
    "A6": a6_spec,
    "A7": a7_spec,
    "A8": a8_spec,
}


def probe_spec(pristine: nbformat.NotebookNode) -> ProbeSpec | None:
    """Return the probe spec of this assignment when its verdicts are decided by the grader."""
    assignment = pristine.metadata.get("course", {}).get("assignment")
    factory = CONVERTED.get(assignment)
    if factory is None:
        return None
    spec = factory()
    checks = {check_id(c) for c in pristine.cells if check_id(c) is not None}
    return spec if checks == set(spec.exercises) else None  # an unknown variant: old path
