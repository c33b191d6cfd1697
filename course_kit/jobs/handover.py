"""No lecture (the kit's plumbing). What every ``./kit`` job shares: the checkout, one-line usage errors, the language it speaks, handing over to a program.

The kit's jobs run the way the bash script ran them: a job that ended in ``exec`` (JupyterLab,
pytest, one benchmark) replaces this process on Linux and macOS, so signals and the exit status
reach the program itself; on Windows, where ``os.exec*`` starts a new process and returns at
once, the job waits for the program and passes on its exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from course_lib.i18n import _

__all__ = [
    "ROOT",
    "KitParser",
    "checkout_problem",
    "hand_over",
    "is_root",
    "one_line_usage_errors",
]

#: The checkout this package lives in (course_kit/jobs/ -> the repository root).
ROOT = Path(__file__).resolve().parents[2]


def _usage_error(job: str, message: str) -> str:
    return _("kit {job}: {message} (see ./kit {job} --help)").format(job=job, message=message)


class KitParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the job's help (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        job = self.prog.removeprefix("./kit").strip() or "kit"
        self.exit(2, _usage_error(job, message) + "\n")


@contextlib.contextmanager
def one_line_usage_errors(job: str) -> Iterator[None]:
    """Make the argument errors of a job's own parser one line, for the call inside the block.

    The grading and cluster command lines build plain ``argparse`` parsers, whose errors print the
    usage and then the error (several lines); the kit's rule is one line naming the fix. Their
    parsers are built inside their ``main``, so the method is swapped for the call only.
    """
    original = argparse.ArgumentParser.error

    def error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
        parser.exit(2, _usage_error(job, message) + "\n")

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def is_root() -> bool:
    """Return True when this process runs as root (never on Windows)."""
    return getattr(os, "geteuid", lambda: 1)() == 0


def checkout_problem(*needed: str) -> str | None:
    """Return why the job cannot run here (a folder of the checkout missing), or None."""
    missing = [name for name in needed if not (ROOT / name).exists()]
    if not missing:
        return None
    return _(
        "{missing} not found next to course_lib in {root}: run the kit from a "
        "checkout of the course (git clone), installed with pip install -e"
    ).format(missing=", ".join(missing), root=ROOT)


def hand_over(argv: list[str], cwd: Path = ROOT) -> int | NoReturn:
    """Run ``argv`` in ``cwd`` in place of this process (POSIX); elsewhere, wait and return its status."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "posix":
        os.chdir(cwd)
        os.execv(argv[0], argv)
    with subprocess.Popen(argv, cwd=cwd) as proc:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the program too: let it finish its exit
                continue
