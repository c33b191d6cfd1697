"""The instructor's lab (docs/instructor.md; lectures 0 and 3 use it): engines that are MPI ranks across the lab's PCs.

A hosts file with ``[mpi] ranks = N`` makes ``./kit lab start`` start, besides every PC's
engines, N more engines that are the ranks of one MPI world: ``mpiexec`` runs here with the
options of ``./kit lab mpi`` (the hydra hostfile, the lab's ``ssh``, TCP only;
:mod:`course_kit.lab.mpi`) and starts ``ipyparallel.engine --mpi`` as every rank, so the
ranks sit on the PCs and their data crosses the lab's network. The engines learn the
controller's address from ``$IPP_CONNECTION_INFO`` (hydra passes this PC's environment to every
rank), so no file has to be copied to the PCs. ``mpiexec``'s pid and the engine ids, in rank
order, are kept in the profile's ``security/lab-mpi-engines.json``; stopping ``mpiexec`` ends
every rank. (ipyparallel's own MPI launcher cannot be used: its cluster file keeps one engine
launcher class, and the lab's engines are started over SSH.)

The seat service deals these engines out only together, as one seat: an MPI world cannot be
split between two notebooks (every collective needs every rank). A notebook's
``start_cluster("mpi", N)`` connected to the lab asks for that seat; the ordinary seats never
contain an MPI engine. A rank stuck inside MPI cannot be interrupted, so the notebook that holds
the world may ask the seat service to restart it (:func:`restart_mpi_engines`, run by the
service on the instructor's PC, where ``mpiexec`` runs): ``cluster.recover()`` does, as it
restarts the MPI engines of a laptop. MPI ranks are not re-added one by one (``lab add``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from course_kit.lab.hosts import LabHosts
from course_kit.lab.mpi import MPI_ENV, lab_mpiexec, mpiexec_options
from course_lib.files import atomic_write_text

__all__ = [
    "MPI_ENGINES_FILE",
    "mpi_engine_ids",
    "restart_mpi_engines",
    "start_mpi_engines",
    "stop_mpi_engines",
]

MPI_ENGINES_FILE = "lab-mpi-engines.json"


def mpi_engine_ids(security: Path) -> list[int]:
    """Return the lab's MPI engines in rank order (empty: the lab has none)."""
    path = security / MPI_ENGINES_FILE
    if not path.is_file():
        return []
    return [int(eid) for eid in json.loads(path.read_text())["ids_by_rank"]]


def _mpi_rank() -> int | None:
    """Return this engine's MPI rank (runs on the engine; None: not an MPI rank)."""
    import sys

    mpi = sys.modules.get("mpi4py.MPI")
    return mpi.COMM_WORLD.Get_rank() if mpi is not None and mpi.Is_initialized() else None


def start_mpi_engines(
    hosts: LabHosts,
    security: Path,
    client: Any,
    timeout: float,
    progress: Callable[[str], Any] = print,
) -> list[int]:
    """Start ``hosts.mpi_ranks`` engines as one MPI world on the PCs; return their ids by rank."""
    ranks = hosts.mpi_ranks
    before = set(client.ids)
    python = next(pc.python for pc in hosts.pcs if pc.engines)
    env = dict(os.environ, **MPI_ENV)
    env["IPP_CONNECTION_INFO"] = (security / "ipcontroller-engine.json").read_text()
    argv = [str(lab_mpiexec()), *mpiexec_options(hosts, security), "-n", str(ranks)]
    argv += [python, "-m", "ipyparallel.engine", "--mpi"]
    log = security / "lab-mpi-engines.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopping it ends hydra and its proxies
        )  # fmt: skip
    record = {"pid": proc.pid, "ids_by_rank": [], "hosts_file": str(hosts.path or "")}
    atomic_write_text(security / MPI_ENGINES_FILE, json.dumps(record))
    started, deadline, seen = time.monotonic(), time.monotonic() + timeout, -1
    while (count := len(set(client.ids) - before)) < ranks:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"mpiexec ended ({proc.returncode}): {' / '.join(tail)}")
        if count != seen:
            progress(f"lab start: {count} of {ranks} MPI ranks registered")
            seen = count
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{ranks - count} of {ranks} MPI ranks did not register in {timeout:g} s"
            )
        time.sleep(0.5)
    new = sorted(set(client.ids) - before)
    by_rank = {eid: client[eid].apply_async(_mpi_rank).get(timeout=timeout) for eid in new}
    if sorted(r for r in by_rank.values() if r is not None) != list(range(ranks)):
        raise RuntimeError(
            f"the MPI engines report ranks {sorted(by_rank.values())}, not 0..{ranks - 1}"
        )
    record["ids_by_rank"] = ids = sorted(new, key=by_rank.__getitem__)
    atomic_write_text(security / MPI_ENGINES_FILE, json.dumps(record))
    progress(
        f"lab start: {ranks} of {ranks} MPI ranks registered "
        f"({time.monotonic() - started:.0f} s; engines {ids})"
    )
    return ids


def stop_mpi_engines(security: Path, wait: float = 15.0) -> bool:
    """End the lab's ``mpiexec`` (and with it every rank); True if one was running."""
    import psutil

    path = security / MPI_ENGINES_FILE
    try:
        pid = int(json.loads(path.read_text())["pid"])
        proc = psutil.Process(pid)
        if "mpiexec" not in " ".join(proc.cmdline()):
            return False  # the pid was reused: not ours
    except (OSError, ValueError, KeyError, psutil.Error):
        return False
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGTERM)  # hydra forwards it to the proxies, which end the ranks
    try:
        proc.wait(wait)
    except psutil.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    return True


def restart_mpi_engines(security: Path, timeout: float = 300.0) -> list[int]:
    """Stop the lab's MPI world and start a new one (here, where ``mpiexec`` runs); new ids.

    Run by the seat service for the notebook that holds the world (its engines are lost).
    """
    import ipyparallel as ipp

    from course_kit.lab.hosts import read_hosts
    from course_kit.lab.roster import record_roster

    record = json.loads((security / MPI_ENGINES_FILE).read_text())
    hosts = read_hosts(record["hosts_file"])
    stop_mpi_engines(security)
    with ipp.Client(str(security / "ipcontroller-client.json")) as client:
        ids = start_mpi_engines(hosts, security, client, timeout, lambda _: None)
        record_roster(security, hosts, client, timeout=timeout)
    return ids
