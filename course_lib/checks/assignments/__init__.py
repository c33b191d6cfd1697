"""The graded assignments' checks, one module per assignment (A1-A6, A8) and its helpers (``aN_*``).

The grader runs their judges (``course_lib.grading``) in its own process on the data the
sandboxed kernel returns (``course_lib.grading.probes``); the notebooks' check cells use the same
judges inside the kernel.
"""

__all__: list[str] = []
