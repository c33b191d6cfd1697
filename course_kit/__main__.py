"""No lecture (the lab). ``python -m course_kit JOB ...``: every job of ``./kit``, without bash (see :mod:`course_kit.jobs`)."""

# First: the jobs that read notebooks (grade, check, release, i18n) import nbformat without the
# IRI grammar it never uses (about 0.8 s of CPU a job; course_grader.lean_nbformat says why).
from course_grader import lean_nbformat  # noqa: F401
from course_kit.jobs import main

if __name__ == "__main__":
    raise SystemExit(main())
