"""Lecture 0: stopping the engines a notebook started: all at once, with one short grace period.

ipyparallel stops the engines of a set one after another, and gives each up to 5 s between
SIGTERM and SIGKILL. An engine that has run torch takes about 3 s to exit after SIGTERM on a quiet
machine (more on a loaded one), so four engines took 4-19 s: every lecture's last cell, and every
test that starts engines, waited that long. A local engine holds nothing to save, so here every
engine gets SIGTERM at once, the set gets one grace period together, and those still alive get
SIGKILL; ipyparallel's own stop then finds them gone and only tidies up (its files, the controller).
MPI engines are treated alike: ``mpiexec``, its proxy and every rank get the signals together.
"""

from __future__ import annotations

import signal
from typing import Any

import psutil

__all__ = ["engine_processes", "stop_owned_cluster"]


def engine_processes(owned: Any) -> list[psutil.Process]:
    """Return the engine processes ``owned`` (an ``ipyparallel.Cluster``) started.

    Local engines: one process each. MPI engines: ``mpiexec`` and every process below it (its
    proxy and the ranks), so that the ranks get the signal themselves, at once.
    """
    processes = []
    for engine_set in list(getattr(owned, "engines", {}).values()):
        launchers = getattr(engine_set, "launchers", None)
        for launcher in list(launchers.values()) if launchers else [engine_set]:
            process = getattr(launcher, "process", None)
            if not isinstance(process, psutil.Process):
                continue
            processes.append(process)
            if not launchers:  # mpiexec: its proxy and the ranks below it
                try:
                    processes.extend(process.children(recursive=True))
                except psutil.Error:
                    pass
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
