"""Lecture 0: stopping the engines a notebook started: all at once, with one short grace period.

ipyparallel stops the engines of a set one after another, and gives each up to 5 s between
SIGTERM and SIGKILL. An engine that has run torch takes about 3 s to exit after SIGTERM on a quiet
machine (more on a loaded one), so four engines took 4-19 s: every lecture's last cell, and every
test that starts engines, waited that long. A local engine holds nothing to save, so here every
engine gets SIGTERM at once, the set gets one grace period together, and those still alive get
SIGKILL; ipyparallel's own stop then finds them gone and only tidies up (its files, the controller).
MPI engines are left to ipyparallel: their one process, ``mpiexec``, must pass the signal on.
"""

from __future__ import annotations

import signal
from typing import Any

import psutil

__all__ = ["engine_processes", "stop_owned_cluster"]


def engine_processes(owned: Any) -> list[psutil.Process]:
    """Return the processes of the local engines ``owned`` (an ``ipyparallel.Cluster``) started."""
    processes = []
    for engine_set in list(getattr(owned, "engines", {}).values()):
        for launcher in list(getattr(engine_set, "launchers", {}).values()):
            process = getattr(launcher, "process", None)
            if isinstance(process, psutil.Process):
                processes.append(process)
    return processes


def _signal(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.Error:  # gone already, or never ours to signal
            pass


def stop_owned_cluster(owned: Any, grace: float = 1.0) -> None:
    """Stop ``owned``'s engines together (SIGTERM, ``grace`` seconds, SIGKILL), then the rest."""
    processes = engine_processes(owned)
    _signal(processes, signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=grace)
    _signal(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5.0)
    owned.stop_cluster_sync()
