"""MPICH's ``mpiexec`` inside a Slurm allocation, given the allocation's hosts itself (``-hosts``).

Hydra (MPICH 5.0.2's ``mpiexec``) reads the allocation's node list from ``SLURM_JOB_NODELIST``
when it is not given one, and its parser dies of a division by zero (SIGFPE, before it prints
anything) on names with digits, then letters, then final digits: ``lab2-pc07``, ``r1-n07``, ``pc1-a7``
(``node07`` and ``pc1-k85v4z4`` parse). ``./kit lab mpi`` on such a cluster failed every time;
in the emulated room, whose names carry a random tag, whenever the tag happened to have that
shape (``pc1-khdyu77``): one test run in a few. The room's tag now always has it.

Here Slurm's own ``scontrol show hostnames`` expands the list and ``SLURM_TASKS_PER_NODE`` gives
each node's ranks, so hydra never parses Slurm's list: ``salloc ... python -m
course_kit.lab.slurm_hosts MPIEXEC ARGS`` runs ``MPIEXEC -hosts h1:2,h2:2,h3:1 ARGS``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["hydra_hosts", "mpiexec_with_hosts", "slurm_hostnames", "tasks_per_node"]

_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def tasks_per_node(spec: str) -> list[int]:
    """Return the ranks of each node from Slurm's compressed count (``"2(x2),1"`` -> [2, 2, 1])."""
    counts: list[int] = []
    for part in spec.split(","):
        match = _COUNT.match(part.strip())
        if match is None:
            raise ValueError(f"SLURM_TASKS_PER_NODE={spec!r}: not Slurm's 'N' or 'N(xK)' list")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def hydra_hosts(names: Sequence[str], counts: Sequence[int]) -> str:
    """Return hydra's ``-hosts`` value: each node with its ranks (``"pc1:2,pc2:1"``)."""
    if len(names) != len(counts):
        raise ValueError(f"{len(names)} nodes but ranks given for {len(counts)}: {list(counts)}")
    return ",".join(f"{name}:{count}" for name, count in zip(names, counts, strict=True))


def slurm_hostnames(nodelist: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Return the host names of a Slurm node list, expanded by Slurm's own ``scontrol``."""
    done = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RuntimeError(f"scontrol show hostnames {nodelist}: {said}")
    return done.stdout.split()


def mpiexec_with_hosts(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Return ``argv`` (``mpiexec`` first) with ``-hosts`` for the allocation ``env`` describes."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    spec = env.get("SLURM_TASKS_PER_NODE")
    if not argv or not nodelist or not spec:
        raise ValueError("run inside a Slurm allocation: salloc ... python -m "
                         "course_kit.lab.slurm_hosts MPIEXEC ARGS")  # fmt: skip
    hosts = hydra_hosts(slurm_hostnames(nodelist, env), tasks_per_node(spec))
    return [argv[0], "-hosts", hosts, *argv[1:]]


def main(argv: Sequence[str] | None = None) -> int:
    """Exec ``mpiexec`` with the allocation's hosts; one line and exit 2 when it cannot."""
    try:
        command = mpiexec_with_hosts(sys.argv[1:] if argv is None else argv, os.environ)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"lab mpi: {exc}", file=sys.stderr)
        return 2
    os.execvp(command[0], command)
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
