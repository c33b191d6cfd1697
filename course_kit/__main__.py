"""No lecture (the lab). ``python -m course_kit JOB ...``: every job of ``./kit``, without bash (see :mod:`course_kit.jobs`)."""

from course_kit.jobs import main

if __name__ == "__main__":
    raise SystemExit(main())
