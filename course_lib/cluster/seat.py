"""Lecture 0: a seat of the lab's engines, the notebook's side (the service is the lab's ``course_kit.lab.seats``).

In the lab, ``start_cluster`` takes a *seat*: a disjoint set of the room's engines that this
notebook holds while it is open, so that no two notebooks drive one engine (their gloo set-ups
would replace each other's process group there). A seat is an open TCP connection to the seat
service the instructor's ``./kit lab start`` runs beside the controller; its address is in the
profile's ``security/lab-seats.json``. The client asks for ``n`` engines (or the whole room), then
sends a heartbeat every ``BEAT_SECONDS`` until it releases the seat or its process ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BEAT_SECONDS",
    "SEATS_FILE",
    "NoSeatError",
    "Seat",
    "ask_seat_service",
    "cluster_digest",
    "take_seat",
]

SEATS_FILE = "lab-seats.json"  # beside ipcontroller-client.json: the service's address
BEAT_SECONDS = 2.0
RELEASE_WAIT_SECONDS = 2.0  # how long a closing client waits for the service to free its seat


class NoSeatError(RuntimeError):
    """No free seat (or no seat service answering); the message is one line."""


def cluster_digest(connection_file: Path) -> str:
    """Return a digest of the cluster's key: a seat file of another cluster is told apart."""
    key = json.loads(connection_file.read_text()).get("key", "")
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def ask_seat_service(
    record: dict[str, Any], request: dict[str, Any], timeout: float
) -> tuple[socket.socket, Any]:
    """Send one request line to the seat service; return the socket and its one-line answer."""
    sock = socket.create_connection((record["ip"], record["port"]), timeout=timeout)
    sock.sendall((json.dumps(request) + "\n").encode())
    reader = sock.makefile("rb")
    line = reader.readline()
    if not line:
        sock.close()
        raise OSError("the seat service closed the connection")
    return sock, json.loads(line)


@dataclass
class Seat:
    """Engines held by this client; released by :meth:`release` or when this process ends."""

    ids: list[int]
    pcs: dict[int, str | None]  # engine -> its PC in the lab's roster (None: not in it)
    sock: socket.socket
    asked: int | None = None  # what the notebook asked for, when the room dealt fewer
    job: str | None = None  # the Slurm job that runs the room's engines (a Slurm lab)
    lost: bool = False
    released: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _sending: threading.Lock = field(default_factory=threading.Lock)

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            try:
                with self._sending:
                    self.sock.sendall(b'{"op": "beat"}\n')
            except OSError:
                self.lost = True  # the service is gone (lab stopped) or freed the seat
                return

    def restart_mpi(self, timeout: float = 300.0) -> list[int]:
        """Ask the service to restart the room's MPI world this seat holds; return its new ids."""
        with self._sending:
            self.sock.sendall(b'{"op": "restart_mpi"}\n')
        self.sock.settimeout(timeout)
        try:
            line = b""
            while not line.endswith(b"\n"):
                if not (chunk := self.sock.recv(1)):
                    raise OSError("the seat service closed the connection")
                line += chunk
        finally:
            self.sock.settimeout(None)
        answer = json.loads(line)
        if not answer.get("ok"):
            raise NoSeatError(answer.get("why", "the MPI ranks were not restarted"))
        self.ids = [int(e) for e in answer["ids"]]
        self.pcs = {int(e): pc for e, pc in answer["pcs"].items()}
        return self.ids

    def release(self) -> None:
        """Give the engines back to the room (again: nothing happens)."""
        if self.released:
            return
        self.released = True
        self._stop.set()
        with contextlib.suppress(OSError), self._sending:
            self.sock.sendall(b'{"op": "release"}\n')
            # Wait (briefly) for the service's answer, so that a notebook's next start_cluster,
            # or another student's, finds the engines free already.
            self.sock.settimeout(RELEASE_WAIT_SECONDS)
            while b"\n" not in (chunk := self.sock.recv(4096)) and chunk:
                pass
        with contextlib.suppress(OSError):
            self.sock.close()


def take_seat(
    connection_file: Path, n: int | None, ids: list[int], timeout: float = 10.0, mpi: bool = False
) -> Seat | None:
    """Take a seat of ``n`` engines (None: the whole room) among ``ids``; None if no service.

    ``mpi``: the seat is the room's MPI world (its engines in rank order), or none.
    Raises :class:`NoSeatError` (one line) when no seat is free or the service does not answer.
    """
    path = connection_file.parent / SEATS_FILE
    if not path.is_file():
        return None  # a cluster started without seats (by hand, or room_cluster): all engines
    record = json.loads(path.read_text())
    who = f"{socket.gethostname()}:{os.getpid()}"
    request = {
        "op": "take",
        "n": n,
        "ids": list(ids),
        "mpi": mpi,
        "who": who,
        "digest": cluster_digest(connection_file),
    }
    try:
        sock, answer = ask_seat_service(record, request, timeout)
    except (OSError, ValueError) as exc:
        raise NoSeatError(
            f"the room's seat service ({record['ip']}:{record['port']}) does not "
            f"answer ({exc}): ask the instructor to restart the lab"
        ) from None
    if not answer.get("ok"):
        sock.close()
        raise NoSeatError(answer.get("why", "no seat"))
    sock.settimeout(None)
    seat = Seat(
        [int(e) for e in answer["ids"]],
        {int(e): pc for e, pc in answer["pcs"].items()},
        sock,
        asked=answer.get("asked"),
        job=record.get("slurm_job"),
    )
    threading.Thread(target=seat._beat, name="course-seat-heartbeat", daemon=True).start()
    return seat
