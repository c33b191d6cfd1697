"""No lecture (the kit's plumbing). The table of ``./kit`` jobs and the dispatcher: ``python -m course_kit JOB ...`` (= ``./kit JOB``).

Every job of the bash script ``kit`` has one row here; ``./kit`` itself only creates the virtual
environment and then runs ``python -m course_kit JOB ARGS``, so a Windows PC (no bash) runs the
same jobs with ``python -m course_kit JOB ARGS`` or the console script ``course-kit JOB ARGS``.
Only the standard library is imported here: ``help`` and a mistyped job are answered before
anything is installed (in English until then; in the kit's language, ``COURSE_LANG``, after).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from course_kit.jobs.bench import bench_job
from course_kit.jobs.delegate import (
    check_job,
    demo_job,
    doctor_job,
    grade_job,
    i18n_job,
    release_job,
    room_job,
)
from course_kit.jobs.lab import lab_job
from course_kit.jobs.setup import setup_job
from course_kit.jobs.slides import slides_job
from course_kit.jobs.suite import test_job
from course_lib.i18n import N_, _

__all__ = ["JOBS", "Job", "help_text", "main"]


@dataclass(frozen=True)
class Job:
    """One job of the kit: its name, its usage lines (usage, what it does) and the function."""

    name: str
    usage: tuple[tuple[str, str], ...]
    run: Callable[[list[str]], int]


# fmt: off
_USAGE = {  # ./kit help's lines per job: (usage, what it does: a message, shown translated)
    "setup": (("setup [--check]", N_("install the kit and its dependencies (./kit: in .venv)")),),
    "lab": (("lab [JUPYTERLAB OPTIONS]", N_("JupyterLab on notebooks/")),
            ("lab start|status|add|stop HOSTS.toml [PC...]", N_("one cluster across the lab's PCs")),
            ("lab mpi HOSTS.toml -- CMD", N_("CMD as MPI ranks on the lab's PCs")),
            ("lab start|status|stop|mpi SLURM.toml", N_("the same on a Slurm cluster ([slurm])"))),
    "demo": (("demo [--engines N] [--kind local|mpi|connect]", N_("headless live demo on engines")),),
    "test": (("test [--quick] [PYTEST ARGS]", N_("ruff, then the whole test suite (--quick: a subset)")),),
    "bench": (("bench NAME [ARGS] | --all | --help", N_("benchmarks in bench/")),),
    "doctor": (("doctor --profile NAME [--network] [--heatmap net.png]",
                N_("check a running (lab) cluster")),),
    "room": (("room up N [--engines E] [--seat S] [--mpi-ranks R]",
              N_("an emulated room: N PCs, E engines each (root, Linux)")),
             ("room status | run PC -- CMD | down", N_("the room's state, a command on a PC, removal")),),
    "release": (("release", N_("student notebooks + checking copies")),),
    "grade": (("grade SUBMISSIONS [--out grades]", N_("grade a folder of submissions")),
              ("grade --self-test", N_("attack the grader; say what held"))),
    "check": (("check NOTEBOOK", N_("grade one notebook as the grader will")),),
    "slides": (("slides NN|all [--out DIR] [--offline]", N_("reveal.js decks from the lectures' stored outputs")),),
    "i18n": (("i18n update|build|check|status [--lang ru]",
              N_("the Russian edition: catalogues, notebooks/ru/, their check")),),
}
_RUN = {"setup": setup_job, "lab": lab_job, "demo": demo_job, "test": test_job,
        "bench": bench_job, "doctor": doctor_job, "room": room_job, "release": release_job,
        "grade": grade_job, "check": check_job, "slides": slides_job, "i18n": i18n_job}
# fmt: on
JOBS: dict[str, Job] = {name: Job(name, usage, _RUN[name]) for name, usage in _USAGE.items()}


def help_text() -> str:
    """Return the list of jobs that ``./kit help`` prints."""
    rows = [("help", N_("this list"))]
    rows[:0] = [row for job in JOBS.values() for row in job.usage]
    width = max(len(usage) for usage, _what in rows)
    lines = [
        _(
            "usage: ./kit JOB [ARGS...]\n"
            "       python -m course_kit JOB [ARGS...]   (the same without bash, e.g. on Windows;"
            " or course-kit JOB)"
        )
    ]
    lines += [f"  {usage:<{width}}  {_(what)}" for usage, what in rows]
    lines.append(_("./kit JOB --help shows a job's options."))
    return "\n".join(lines)


def _help(argv: list[str]) -> int:
    print(help_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the job named by the first argument with the rest; return its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv.pop(0) if argv else "help"
    if name in ("help", "-h", "--help"):
        return _quietly(_help, [])
    job = JOBS.get(name)
    if job is None:
        print(
            _(
                "kit: no job named {name}; choose one of: {jobs} (./kit help lists "
                "them with their options)"
            ).format(name=repr(name), jobs=", ".join(JOBS)),
            file=sys.stderr,
        )
        return 2
    return _quietly(job.run, argv)


def _quietly(run: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a job; a reader that stops early (``./kit bench --help | head``) ends it quietly."""
    try:
        return run(argv)
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit: point it elsewhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
