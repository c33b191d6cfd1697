"""No lecture (the kit's plumbing). ``./kit lab``: JupyterLab on ``notebooks/``, or (``start | status | add | stop | mpi``) the lab's cluster.

The cluster's actions are :mod:`course_kit.jobs.cluster`'s ``lab`` command line; anything else
goes to JupyterLab (as root with ``--allow-root``, as ``./kit lab`` always did).
"""

from __future__ import annotations

import sys

from course_kit.jobs.handover import (
    ROOT,
    checkout_problem,
    hand_over,
    is_root,
    one_line_usage_errors,
)

__all__ = ["ACTIONS", "lab_job"]

ACTIONS = ("start", "status", "add", "stop", "mpi")
USAGE = """\
usage: ./kit lab [JUPYTERLAB OPTIONS]              JupyterLab on notebooks/ (./kit lab --help-all: its options)
       ./kit lab start|status|stop HOSTS.toml      one cluster across the lab's PCs (SSH)
       ./kit lab status                            the running lab cluster, if any
       ./kit lab add HOSTS.toml PC...              start again the engines of PCs that dropped out
       ./kit lab mpi HOSTS.toml [--ranks N] -- CMD CMD as MPI ranks on the lab's PCs
       ./kit lab start|status|stop|mpi SLURM.toml  the same on a Slurm cluster (a [slurm] lab file)
./kit lab start --help: the cluster actions' options."""


def lab_job(argv: list[str]) -> int:
    """Run a cluster action, or hand over to JupyterLab; return the exit status."""
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if argv and argv[0] in ACTIONS:
        from course_kit.jobs.cluster import main

        with one_line_usage_errors("lab"):
            return main(["lab", *argv], prog="./kit")
    if (problem := checkout_problem("notebooks")) is not None:
        print(f"kit lab: {problem}", file=sys.stderr)
        return 2
    extra = ["--allow-root"] if is_root() else []
    lab = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={ROOT / 'notebooks'}"]
    return hand_over([*lab, *extra, *argv], ROOT)
