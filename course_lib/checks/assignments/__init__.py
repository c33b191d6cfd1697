"""The graded assignments' checks, one module per assignment (A1-A6) and its helpers (``aN_*``).

The grader runs them (``course_lib.grading``); for A1 and A2 it runs them in its own process on
the data the sandboxed kernel returns (``course_lib.grading.probes``).
"""

__all__: list[str] = []
