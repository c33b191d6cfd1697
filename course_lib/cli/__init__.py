"""No lecture (the kit's plumbing). Every ``./kit`` job as Python: ``python -m course_lib JOB ...`` or ``course-kit JOB ...``.

One module per group of jobs: :mod:`~course_lib.cli.setup` (installing), :mod:`~course_lib.cli.lab`
(JupyterLab and the lab's cluster), :mod:`~course_lib.cli.suite` (the tests),
:mod:`~course_lib.cli.bench` (benchmarks), :mod:`~course_lib.cli.delegate` (demo, doctor, room and
the assignments' jobs, each run by its own package's command line); the table and the dispatcher
are in :mod:`~course_lib.cli.jobs`.
"""

from course_lib.cli.jobs import JOBS, Job, help_text, main

__all__ = ["JOBS", "Job", "help_text", "main"]
