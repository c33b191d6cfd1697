"""Lecture 0: the ``mpiexec`` command for MPI engines on this PC, also inside a Slurm job on a cluster's node.

A notebook running in a Slurm job (JupyterLab started with ``sbatch``/``salloc`` on a
university cluster) has the allocation's variables in its environment, and MPICH's ``mpiexec``
(hydra) then takes its hosts from Slurm: its parser of the node list dies of SIGFPE on names such
as ``lab2-pc07`` (see course_kit/lab/slurm_hosts.py), and with names it reads it would start
ranks on the allocation's other nodes through ``srun``, where they cannot reach a controller that
listens on this PC's loopback. ``start_cluster(kind="mpi")`` means ranks on this PC, so hydra is
told so (``-launcher fork -hosts localhost``); other MPIs, and every mpiexec outside Slurm, are
run as they are.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

__all__ = ["in_slurm_allocation", "is_hydra", "mpiexec_here"]

HERE_OPTIONS = ("-launcher", "fork", "-hosts", "localhost")


def in_slurm_allocation(env: Mapping[str, str] | None = None) -> bool:
    """Return whether ``env`` (default: this process's) is inside a Slurm job or allocation."""
    env = os.environ if env is None else env
    return bool(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))


def is_hydra(mpiexec: str) -> bool:
    """Return whether ``mpiexec`` is MPICH's hydra (``mpiexec --version`` says ``HYDRA``)."""
    try:
        done = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in done.stdout


def mpiexec_here(mpiexec: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Return the command that starts ranks of ``mpiexec`` on this PC only."""
    if in_slurm_allocation(env) and is_hydra(mpiexec):
        return [mpiexec, *HERE_OPTIONS]
    return [mpiexec]
