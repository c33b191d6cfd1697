"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): MPI ranks across the lab's PCs from the hosts file: ``./kit lab mpi hosts.toml -- CMD``.

The hosts file becomes an MPICH (hydra) hostfile, ``PC:engines`` per line, so a PC runs as many
ranks as it runs engines; ``mpiexec`` starts them over the same ``ssh`` the engines use
(``-launcher ssh -launcher-exec``: the hosts file's ``[ssh] command``, which in the emulated
room is the stand-in that runs commands inside a PC's namespace). Every PC needs the venv at the
same path as the instructor's (``mpiexec`` starts ``hydra_pmi_proxy`` from its own folder).

The kit, not the instructor, sets what keeps the ranks' data on the network (``MPI_ENV``): MPICH
from PyPI moves data with UCX, and UCX takes shared memory or cross-memory attach between
processes it finds on one machine. On a real lab that is only ranks of one PC; in the emulated
room, where every PC is a namespace of one kernel, it would carry the ranks' data around the
shaped links and make every measurement wrong. ``UCX_TLS=tcp`` leaves UCX only TCP; ranks of one
PC still share memory through MPICH's own shared-memory layer (hydra places ranks by hostfile
line, so two PCs are never one node to MPICH).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from course_kit.lab.hosts import LabHosts

__all__ = [
    "MPI_ENV",
    "lab_mpiexec",
    "mpiexec_command",
    "mpiexec_options",
    "run_lab_mpi",
    "write_hostfile",
]

MPI_ENV = {
    "UCX_TLS": "tcp",  # no shared memory / cma between "hosts" UCX finds on one kernel
    "UCX_WARN_UNUSED_ENV_VARS": "n",  # UCX_* set for every rank are not all read by each
}


def write_hostfile(hosts: LabHosts, path: Path) -> Path:
    """Write the hydra hostfile of ``hosts`` (``PC:ranks`` per PC with engines) to ``path``."""
    lines = []
    for pc in hosts.pcs:
        if "@" in pc.host:
            raise ValueError(
                f"{pc.host}: MPICH's hostfile has no user@ form; put the user in ~/.ssh/config "
                "(Host ... User ...) and list the PC by name"
            )
        if pc.engines:
            lines.append(f"{pc.host}:{pc.engines}\n")
    path.write_text("".join(lines))
    return path


def _launcher_exec(hosts: LabHosts, folder: Path) -> str:
    """Return one program for hydra's ``-launcher-exec`` (it takes no arguments of its own)."""
    if len(hosts.ssh) == 1:
        return hosts.ssh[0]
    wrapper = folder / "lab-mpi-ssh"
    quoted = " ".join("'" + arg.replace("'", "'\\''") + "'" for arg in hosts.ssh)
    wrapper.write_text(f'#!/bin/sh\nexec {quoted} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(wrapper)


def mpiexec_options(hosts: LabHosts, folder: Path) -> list[str]:
    """Return mpiexec's options that place ranks on the PCs of ``hosts`` over its ``ssh``.

    The hostfile (and, if ``[ssh] command`` has arguments, a wrapper) is written into ``folder``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    hostfile = write_hostfile(hosts, folder / "lab-mpi-hosts")
    options = ["-launcher", "ssh", "-launcher-exec", _launcher_exec(hosts, folder)]
    options += ["-f", str(hostfile)]
    for name, value in MPI_ENV.items():
        options += ["-genv", name, value]
    return options


def lab_mpiexec() -> Path:
    """Return this venv's ``mpiexec`` (hydra starts its proxies from the same folder on every PC)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        raise ValueError(f"no {mpiexec}: install MPICH into this venv (pip install mpich mpi4py)")
    return mpiexec


def mpiexec_command(
    hosts: LabHosts, folder: Path, argv: Sequence[str], n: int | None = None
) -> list[str]:
    """Return the ``mpiexec`` command that runs ``argv`` as ``n`` ranks on the PCs of ``hosts``.

    ``n`` defaults to the engines of all PCs; see :func:`mpiexec_options` for ``folder``.
    """
    n = hosts.engines if n is None else n
    if not 1 <= n <= hosts.engines:
        raise ValueError(f"n={n}: use 1..{hosts.engines} ranks (the engines of the hosts file)")
    if not argv:
        raise ValueError("no command: ./kit lab mpi HOSTS -- python my_script.py")
    mpiexec = lab_mpiexec()
    return [str(mpiexec), *mpiexec_options(hosts, folder), "-n", str(n), *argv]


def run_lab_mpi(
    hosts: LabHosts,
    folder: Path,
    argv: Sequence[str],
    n: int | None = None,
    timeout: float | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``argv`` as MPI ranks on the lab's PCs and wait for it (see :func:`mpiexec_command`)."""
    env = dict(os.environ, **MPI_ENV)
    return subprocess.run(
        mpiexec_command(hosts, folder, argv, n),
        env=env,
        timeout=timeout,
        capture_output=capture,
        text=True,
    )
