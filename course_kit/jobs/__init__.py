"""No lecture (the kit's plumbing). Every ``./kit`` job as Python: ``python -m course_kit JOB ...`` or ``course-kit JOB ...``.

One module per group of jobs: :mod:`~course_kit.jobs.setup` (installing), :mod:`~course_kit.jobs.lab`
(JupyterLab and the lab's cluster), :mod:`~course_kit.jobs.suite` (the tests),
:mod:`~course_kit.jobs.bench` (benchmarks), :mod:`~course_kit.jobs.delegate` (demo, doctor, room and
the assignments' jobs, each run by its own package's command line); the table and the dispatcher
are in :mod:`~course_kit.jobs.table`.
"""

from course_kit.jobs.table import JOBS, Job, help_text, main

__all__ = ["JOBS", "Job", "help_text", "main"]
