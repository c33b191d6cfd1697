"""No lecture (the kit's plumbing). ``python -m course_lib JOB ...``: every job of ``./kit``, without bash (see :mod:`course_lib.cli`)."""

from course_lib.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
