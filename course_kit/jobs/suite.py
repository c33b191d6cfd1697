"""No lecture (the kit's plumbing). ``./kit test``: ruff on the code, then pytest on ``tests/`` and every notebook (what CI runs); ``--quick`` a developer's subset."""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec

from course_kit.jobs.handover import ROOT, checkout_problem, hand_over

__all__ = ["LINTED", "PYTEST_ARGS", "QUICK_ARGS", "test_job"]

LINTED = ("course_lib", "course_grader", "course_kit", "tests", "bench")
# Two workers: most tests wait on engines, ranks or a kernel, so two keep two cores busy. A file
# stays on one worker (--dist loadfile): a module's fixtures start once and a notebook's cells
# run in order in one kernel; each worker has its own engine pool. Files are handed out in
# collection order (--no-loadscope-reorder), which tests/conftest.py starts with the longest.
PYTEST_ARGS = (
    "tests", "notebooks", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder",
    "--durations=30",
)  # fmt: skip
# The inner loop (``--quick``, a few minutes): the library's tests and the layout's, no emulated
# room, no MPI, nothing marked slow, no notebook; the grader's and the lab's whole runs are CI's.
QUICK_ARGS = (
    "tests/lib", "tests/test_layout.py", "tests/grader/assignments/test_checks_a1.py",
    "tests/kit/jobs", "-n", "2", "--dist", "loadfile", "--durations=10",
    "-m", "not slow and not room and not mpi",
)  # fmt: skip
USAGE = (
    f"usage: ./kit test [--quick] [PYTEST ARGS...]: ruff check and ruff format --check "
    f"{' '.join(LINTED)}, then pytest {' '.join(PYTEST_ARGS)} PYTEST ARGS (pytest --help lists "
    f"pytest's options); --quick runs pytest {' '.join(QUICK_ARGS)} instead"
)


def test_job(argv: list[str]) -> int:
    """Lint, then hand over to pytest with the suite's arguments and ``argv``; return the status."""
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    problem = checkout_problem("tests", "notebooks")
    missing = [name for name in ("ruff", "pytest", "xdist") if find_spec(name) is None]
    if missing:
        problem = (
            f"{', '.join(missing)} not installed in {sys.executable}: install the "
            "kit's dev extra (python -m course_kit setup)"
        )
    if problem is not None:
        print(f"kit test: {problem}", file=sys.stderr)
        return 2
    for ruff in (["check"], ["format", "--check"]):  # lint, then the formatter's layout (STYLE 19)
        lint = subprocess.run([sys.executable, "-m", "ruff", *ruff, *LINTED], cwd=ROOT, check=False)
        if lint.returncode != 0:
            return lint.returncode
    args = PYTEST_ARGS
    if argv[:1] == ["--quick"]:
        args, argv = QUICK_ARGS, argv[1:]
    return hand_over([sys.executable, "-m", "pytest", *args, *argv], ROOT)
