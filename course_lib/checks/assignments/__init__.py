"""The graded assignments' checks, one module per assignment (A1-A8) and its helpers (``aN_*``;
A7's as the package ``a7``: ``a7.collect``, ``a7.judge``).

The grader runs their judges (``course_lib.grading``) in its own process on the data the
sandboxed kernel returns (``course_lib.grading.probes``); the notebooks' check cells use the same
judges inside the kernel.
"""

__all__: list[str] = []
