"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): Which engine runs on which lab PC, and which PCs have dropped out: the lab's roster.

``./kit lab start`` and ``add`` ask every new engine where it runs (host name and addresses),
match that to a PC of the hosts file, and keep the answer in the profile's
``security/lab-roster.json``. ``./kit lab status`` then names the PCs whose engines are gone,
even after the controller has forgotten them:

- an engine that is killed, or whose PC is switched off or loses its link, stops answering the
  controller's heartbeat; after ``HEARTBEAT_MISSES`` missed pings ``HEARTBEAT_MS`` apart the
  controller unregisters it, and every client (each student's notebook) drops it from
  ``client.ids``; the other engines go on working;
- ``status`` asks every registered engine where it runs; one that does not answer at once is
  waited for until the heartbeat has decided: unregistered means dropped out, still registered
  means busy (a student's long computation), since the heartbeat is answered by a thread of its
  own.

So a dropped PC is named once the controller has unregistered its engines, at most
``(HEARTBEAT_MISSES + 1) * HEARTBEAT_MS`` (12 s) after it dropped out, plus the time ``status``
itself takes; ``bench/bench_lab_faults.py`` measures it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_kit.lab.hosts import LabHosts, LabPC
from course_lib.files import atomic_write_text

__all__ = [
    "HEARTBEAT_MISSES",
    "HEARTBEAT_MS",
    "ROSTER_FILE",
    "engine_place",
    "pc_of",
    "read_roster",
    "record_roster",
    "roster_report",
]

# ipyparallel's defaults are a ping every 3 s and 10 misses (30-33 s to notice a dead engine);
# the lab's controller pings every 2 s and unregisters after 5 misses: 10-12 s. An engine's
# heartbeat is answered by a C thread (zmq), so a busy engine still answers: a shorter bound
# does not drop engines that compute.
HEARTBEAT_MS = 2000
HEARTBEAT_MISSES = 5
ROSTER_FILE = "lab-roster.json"


def engine_place() -> dict[str, Any]:
    """Return where this engine runs: host name, IPv4 addresses and pid (runs on the engine)."""
    import socket

    import psutil

    addresses = sorted(
        addr.address
        for addrs in psutil.net_if_addrs().values()
        for addr in addrs
        if addr.family == socket.AF_INET and not addr.address.startswith("127.")
    )
    return {"host": socket.gethostname(), "addresses": addresses, "pid": os.getpid()}


def _address_of(location: str) -> str | None:
    try:
        return socket.gethostbyname(location)
    except OSError:
        return None


def pc_of(hosts: LabHosts, place: dict[str, Any]) -> LabPC | None:
    """Return the PC of the hosts file that ``place`` (from :func:`engine_place`) is on, or None.

    By address first (PCs cloned from one image share a host name), then by host name, then by
    the address the PC's name resolves to here (the slow path: a DNS lookup).
    """
    locations = [(pc, pc.host.rpartition("@")[2]) for pc in hosts.pcs]
    short = str(place["host"]).split(".")[0].lower()
    for match in (
        lambda location: location in place["addresses"],
        lambda location: location.split(".")[0].lower() == short,
        lambda location: _address_of(location) in place["addresses"],
    ):
        for pc, location in locations:
            if match(location):
                return pc
    return None


def read_roster(security: Path) -> dict[int, dict[str, Any]]:
    """Return the roster: engine id -> {"pc", "host", "pid"} (empty when none was written)."""
    path = security / ROSTER_FILE
    if not path.is_file():
        return {}
    return {int(eid): row for eid, row in json.loads(path.read_text()).items()}


def record_roster(security: Path, hosts: LabHosts, client: Any, timeout: float = 60.0) -> None:
    """Ask the engines not yet in the roster where they run, and add them to it."""
    roster = {eid: row for eid, row in read_roster(security).items() if eid in client.ids}
    new = [eid for eid in client.ids if eid not in roster]
    pending = {eid: client[eid].apply_async(engine_place) for eid in new}
    for eid, result in pending.items():
        place = result.get(timeout=timeout)
        pc = pc_of(hosts, place)
        roster[eid] = {"pc": pc.host if pc else None, "host": place["host"], "pid": place["pid"]}
    atomic_write_text(security / ROSTER_FILE, json.dumps(roster, indent=1, sort_keys=True))


def _answers(client: Any, within: float) -> tuple[set[int], set[int]]:
    """Return (engines that answered, engines still registered but silent) after ``within`` s.

    An engine that is unregistered meanwhile is in neither set: it dropped out.
    """
    pending = {eid: client[eid].apply_async(engine_place) for eid in client.ids}
    deadline = time.monotonic() + within
    answered: set[int] = set()
    while True:
        registered = set(client.ids)  # also takes in the controller's unregistrations
        for eid, result in pending.items():
            if eid in registered and result.ready() and result.successful():
                answered.add(eid)
        waiting = registered & set(pending) - answered
        if not waiting or time.monotonic() > deadline:
            return answered, waiting
        time.sleep(0.2)


def roster_report(
    hosts: LabHosts,
    security: Path,
    client: Any,
    within: float | None = None,
    mpi_ids: Sequence[int] = (),
) -> tuple[bool, list[str], list[str]]:
    """Return (every PC has all its engines, per-PC lines, the PCs that dropped out).

    An engine that does not answer at once is waited for until the controller's heartbeat has
    decided (``within``, default the heartbeat bound plus 5 s): unregistered means gone; still
    registered means alive but busy (its heartbeat is answered by a thread of its own).
    ``mpi_ids``: the lab's MPI world (:mod:`course_kit.lab.mpi_engines`), on a line of
    its own rather than counted with their PCs' engines.
    """
    if within is None:
        within = (HEARTBEAT_MISSES + 1) * HEARTBEAT_MS / 1000 + 5
    roster = read_roster(security)
    answered, busy = _answers(client, within)
    registered = answered | busy

    def pc_host(eid: int) -> str | None:
        return roster.get(eid, {}).get("pc")

    lines, dropped = [], []
    for pc in hosts.pcs:
        here = sorted(eid for eid in registered if pc_host(eid) == pc.host and eid not in mpi_ids)
        gone = sorted(
            eid
            for eid in roster
            if eid not in registered and pc_host(eid) == pc.host and eid not in mpi_ids
        )
        text = f"  {pc.host}: {len(here)} of {pc.engines} engines answer"
        if busy_here := [eid for eid in here if eid in busy]:
            text += f" (engines {busy_here} busy: registered, but still computing)"
        if len(here) < pc.engines:
            dropped.append(pc.host)
            why = f"engines {gone} unregistered (missed heartbeats)" if gone else "no engines"
            text += (
                f"  DROPPED OUT: {why}. PC off, engines killed or link cut? "
                f"Re-add: ./kit lab add HOSTS {pc.host}"
            )
        lines.append(text)
    broken = False
    if mpi_ids:
        alive = [eid for eid in mpi_ids if eid in registered]
        text = f"  MPI ranks: {len(alive)} of {len(mpi_ids)} answer (engines {mpi_ids})"
        if broken := len(alive) < len(mpi_ids):
            text += "  BROKEN: a world that lost a rank cannot be mended; restart the lab"
        lines.append(text)
    strays = sorted(eid for eid in registered if pc_host(eid) is None)
    if strays:
        lines.append(f"  engines {strays}: on no PC of the hosts file")
    return not dropped and not broken, lines, dropped
