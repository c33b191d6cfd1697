"""No lecture (the kit's plumbing). The jobs that another package's command line does: demo, doctor, room, release, grade, check, i18n.

Each is the call ``./kit`` made before it became a wrapper (``python -m course_lib.demo``,
``course_kit.jobs.cluster doctor | room``, ``course_grader release | grade | check | selftest``),
now made in this process; the packages' own argument errors become one line.
"""

from __future__ import annotations

import signal
import sys

from course_kit.jobs.handover import one_line_usage_errors

__all__ = [
    "check_job",
    "demo_job",
    "doctor_job",
    "grade_job",
    "i18n_job",
    "release_job",
    "room_job",
]


def demo_job(argv: list[str]) -> int:
    """``./kit demo``: the headless live demo (:mod:`course_lib.demo`)."""
    from course_lib.demo import main

    # As `python -m course_lib.demo` does: a SIGTERM leaves through `with`, stopping the engines.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return main(argv)


def _cluster(job: str, argv: list[str]) -> int:
    from course_kit.jobs.cluster import main

    with one_line_usage_errors(job):
        return main([job, *argv], prog="./kit")


def doctor_job(argv: list[str]) -> int:
    """``./kit doctor``: check every engine of a running cluster."""
    return _cluster("doctor", argv)


def room_job(argv: list[str]) -> int:
    """``./kit room``: the emulated room (root, Linux)."""
    return _cluster("room", argv)


def _grading(job: str, argv: list[str]) -> int:
    from course_grader.__main__ import main

    with one_line_usage_errors(job):
        return main(argv)


def release_job(argv: list[str]) -> int:
    """``./kit release``: student notebooks and checking copies from the assignment sources."""
    return _grading("release", ["release", *argv])


def grade_job(argv: list[str]) -> int:
    """``./kit grade SUBMISSIONS`` grades a folder; ``./kit grade --self-test`` attacks the grader."""
    if argv[:1] == ["--self-test"]:
        return _grading("grade", ["selftest", *argv[1:]])
    return _grading("grade", ["grade", *argv])


def check_job(argv: list[str]) -> int:
    """``./kit check NOTEBOOK``: grade one notebook the way the grader will."""
    return _grading("check", ["check", *argv])


def i18n_job(argv: list[str]) -> int:
    """``./kit i18n``: the translated editions (:mod:`course_kit.i18n`)."""
    from course_kit.i18n.__main__ import main

    with one_line_usage_errors("i18n"):
        return main(argv, prog="./kit i18n")
