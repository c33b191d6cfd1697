"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): Seats for a room of students: each notebook holds engines of its own (``./kit lab start``).

A room of students shares one lab cluster. If two notebooks drove the same engine, their gloo
set-ups would replace each other's process group there (one default group per process), so the
room's engines are dealt out as *seats*: a disjoint set of engines, spread over the PCs, that one
client holds while it is open. The instructor's ``lab start`` runs a small seat service beside
the controller (this module's :func:`serve`, a process of its own) and writes its address into
the profile's ``security/lab-seats.json``, next to ``ipcontroller-client.json``.

A seat *is* an open TCP connection to the service:

- a client asks for ``n`` engines (or the whole room, the instructor's demo) and gets a seat, or
  one line saying why not (no free seat: how many are held, by how many notebooks);
- it then sends a heartbeat every ``BEAT_SECONDS``; the service frees the seat when the client
  closes it (``cluster.stop()``), when the connection drops (the notebook's kernel died: the OS
  closes its socket) or when no heartbeat came for ``EXPIRY_SECONDS`` (the PC was switched off
  or lost its link);
- the service keeps seats only in memory: stopping it (``lab stop``) frees every seat; it
  logs every seat taken and given back to ``security/lab-seats.log`` (who held what, when).

So no two clients that took seats ever run collectives on one engine at the same time.

Kept whole: one protocol, the seat service and its book of seats read together.
"""

from __future__ import annotations

import contextlib
import json
import os
import socketserver
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_kit.lab.mpi_engines import mpi_engine_ids, restart_mpi_engines
from course_lib.cluster.seat import SEATS_FILE, ask_seat_service, cluster_digest
from course_lib.files import atomic_write_text

__all__ = [
    "EXPIRY_SECONDS",
    "SEATS_LOG",
    "seat_lines",
    "serve",
    "start_seat_service",
    "stop_seat_service",
]

SEATS_LOG = "lab-seats.log"  # one line per seat taken or given back, for the instructor
# Five missed beats: a busy student's kernel still beats (a thread of its own, and torch
# releases the GIL), so only a gone client misses that many.
EXPIRY_SECONDS = 10.0


def _roster_pcs(security: Path) -> dict[int, str]:
    """Return engine id -> PC from the lab's roster (engines missing from it: ``"?"``)."""
    from course_kit.lab.roster import read_roster

    return {
        eid: row.get("pc") or row.get("host") or "?" for eid, row in read_roster(security).items()
    }


# -- the service (the instructor's PC) --------------------------------------------------------------
@dataclass
class _Seats:
    """The seats held now; one lock, since every connection is served by a thread of its own."""

    security: Path
    digest: str
    seat_size: int | None = None  # the instructor's engines per notebook; None: as asked
    held: dict[int, dict[str, Any]] = field(default_factory=dict)  # seat number -> seat
    lock: threading.Lock = field(default_factory=threading.Lock)
    restarting: threading.Lock = field(default_factory=threading.Lock)
    counter: int = 0

    def take(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("digest") != self.digest:
            return {
                "ok": False,
                "why": "this seat service belongs to another cluster: ask the "
                "instructor for the current ipcontroller-client.json and lab-seats.json",
            }
        registered = [int(eid) for eid in request.get("ids", [])]
        pcs = _roster_pcs(self.security)
        mpi_ids = mpi_engine_ids(self.security)
        with self.lock:
            busy = {eid for seat in self.held.values() for eid in seat["ids"]}
            holders = len(self.held)
            if request.get("mpi"):
                answer = _mpi_seat(mpi_ids, registered, busy, request.get("n"))
                if answer is not None:
                    return answer
                ids = list(mpi_ids)  # in rank order: the seat is the whole MPI world
            else:
                # An MPI world is dealt out only whole, to a notebook that asks for MPI ranks.
                ordinary = [eid for eid in registered if eid not in mpi_ids]
                free = [eid for eid in ordinary if eid not in busy]
                busy_here = len(ordinary) - len(free)
                want = request.get("n")
                if want is not None and self.seat_size is not None:
                    want = min(want, self.seat_size)  # the room's seats, whatever was asked
                if want is None:  # the whole room (the instructor's demo)
                    if busy_here:
                        return {
                            "ok": False,
                            "why": f"the whole room was asked for, but {holders} "
                            f"notebook(s) hold {busy_here} of its {len(ordinary)} engines",
                        }
                    want = len(free)
                if want > len(free):
                    return {
                        "ok": False,
                        "why": f"no free seat of {want} engines: {busy_here} of the "
                        f"room's {len(ordinary)} engines are held by {holders} notebook(s), "
                        f"{len(free)} free",
                    }
                ids = _spread(free, pcs)[:want]
            self.counter += 1
            number = self.counter
            self.held[number] = {
                "ids": ids,
                "who": str(request.get("who", "?")),
                "since": time.time(),
            }
            what = "MPI ranks" if request.get("mpi") else "engines"
            self._log(f"seat {number} to {self.held[number]['who']}: {what} {ids}")
        answer = {"ok": True, "seat": number, "ids": ids, "pcs": {str(e): pcs.get(e) for e in ids}}
        if not request.get("mpi") and request.get("n") is not None and len(ids) < request["n"]:
            answer["asked"] = request["n"]  # dealt the room's seat size: the client says so
        return answer

    def release(self, number: int | None) -> None:
        with self.lock:
            if self.held.pop(number, None) is not None:
                self._log(f"seat {number} given back")

    def _log(self, line: str) -> None:
        """Add a line to the room's seat log (who held which engines when: ``lab-seats.log``)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with contextlib.suppress(OSError), open(self.security / SEATS_LOG, "a") as log:
            log.write(f"{stamp} {line}\n")

    def restart_mpi(self, number: int | None) -> dict[str, Any]:
        """Restart the room's MPI world for the seat ``number`` that holds it; its new engines."""
        mpi_ids = mpi_engine_ids(self.security)
        with self.lock:
            seat = self.held.get(number)
        if seat is None or not mpi_ids or seat["ids"] != mpi_ids:
            return {"ok": False, "why": "only the notebook that holds the MPI ranks restarts them"}
        with self.restarting:  # one restart at a time
            try:
                ids = restart_mpi_engines(self.security)
            except Exception as exc:  # noqa: BLE001 - said to the notebook in one line
                return {"ok": False, "why": f"restarting the MPI ranks failed: {exc}"}
        with self.lock:
            seat["ids"] = ids
            self._log(f"seat {number}: MPI ranks restarted, now engines {ids}")
        pcs = _roster_pcs(self.security)
        return {"ok": True, "ids": ids, "pcs": {str(e): pcs.get(e) for e in ids}}

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {"ok": True, "seats": [dict(seat, seat=n) for n, seat in self.held.items()]}


def _mpi_seat(
    mpi_ids: list[int], registered: list[int], busy: set[int], want: int | None
) -> dict[str, Any] | None:
    """Return why the room's MPI world cannot be this seat (a refusal), or None: it can."""
    if not mpi_ids:
        return {
            "ok": False,
            "why": "the room's cluster has no MPI ranks (the instructor adds [mpi] ranks = N "
            "to the hosts file)",
        }
    if want is not None and want != len(mpi_ids):
        return {
            "ok": False,
            "why": f"the room's MPI world has {len(mpi_ids)} ranks, not {want}: ask for "
            f'start_cluster("mpi", {len(mpi_ids)})',
        }
    if missing := [eid for eid in mpi_ids if eid not in registered]:
        return {
            "ok": False,
            "why": f"the room's MPI world lost engines {missing}: the instructor restarts the lab",
        }
    if busy & set(mpi_ids):
        return {"ok": False, "why": "the room's MPI ranks are held by another notebook"}
    return None


def _spread(free: list[int], pcs: dict[int, str]) -> list[int]:
    """Order engines so that a seat lies on as many PCs as possible, taking first from the PCs
    with the most free engines (so the seats dealt next still find several PCs)."""
    by_pc: dict[str, list[int]] = {}
    for eid in sorted(free):
        by_pc.setdefault(pcs.get(eid, "?"), []).append(eid)
    order: list[int] = []
    while by_pc:
        # One engine from each PC per round, fullest PCs first.
        for pc in sorted(by_pc, key=lambda pc: (-len(by_pc[pc]), pc)):
            order.append(by_pc[pc].pop(0))
        by_pc = {pc: ids for pc, ids in by_pc.items() if ids}
    return order


class _Handler(socketserver.StreamRequestHandler):
    """One client's connection: its seat lives exactly as long as this handler."""

    def handle(self) -> None:
        seats: _Seats = self.server.seats  # type: ignore[attr-defined]
        self.connection.settimeout(EXPIRY_SECONDS)  # no line for that long: the client is gone
        number = None
        try:
            for line in self.rfile:
                request = json.loads(line)
                op = request.get("op")
                if op == "take" and number is None:
                    answer = seats.take(request)
                    number = answer.get("seat")
                elif op == "status":
                    answer = seats.status()
                elif op == "restart_mpi" and number is not None:
                    answer = seats.restart_mpi(number)
                elif op == "beat":
                    continue
                elif op == "release":  # free the engines first, then say so: the client waits
                    seats.release(number)
                    number = None
                    self.wfile.write(b'{"ok": true, "released": true}\n')
                    break
                else:  # anything unexpected: end the seat
                    break
                self.wfile.write((json.dumps(answer) + "\n").encode())
        except (OSError, ValueError):
            pass  # timeout (missed heartbeats), reset, or garbage: the seat ends
        finally:
            seats.release(number)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(
    security: Path,
    host: str,
    address_for_clients: str,
    seat_size: int | None = None,
    slurm_job: str | None = None,
) -> None:
    """Run the seat service for the cluster in ``security`` until killed (``lab stop``)."""
    connection_file = security / "ipcontroller-client.json"
    server = _Server((host, 0), _Handler)
    digest = cluster_digest(connection_file)
    server.seats = _Seats(security, digest, seat_size)  # type: ignore[attr-defined]
    port = server.server_address[1]
    record = {
        "ip": address_for_clients,
        "port": port,
        "pid": os.getpid(),
        "digest": digest,
        "seat": seat_size,
        "slurm_job": slurm_job,  # a notebook whose engines die names the job (engine_death)
    }
    atomic_write_text(security / SEATS_FILE, json.dumps(record))
    server.serve_forever()


def start_seat_service(
    security: Path,
    listen_ip: str,
    timeout: float = 30.0,
    seat_size: int | None = None,
    slurm_job: str | None = None,
) -> int:
    """Start :func:`serve` as a process of its own for the cluster in ``security``; return its pid.

    ``seat_size``: the engines each notebook's seat gets at most (the hosts file's
    ``[controller] seat``); a notebook that asks for more runs on that many and says so.
    """
    client = json.loads((security / "ipcontroller-client.json").read_text())
    host = "0.0.0.0" if listen_ip in ("*", "0.0.0.0", "") else listen_ip
    reach = client.get("location") if host == "0.0.0.0" else listen_ip
    (security / SEATS_FILE).unlink(missing_ok=True)
    code = "import sys; from pathlib import Path; from course_kit.lab.seats import serve; "
    code += "serve(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]) or None, "
    code += "sys.argv[5] or None)"
    argv = [str(security), host, str(reach), str(seat_size or 0), str(slurm_job or "")]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while not (security / SEATS_FILE).is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"the seat service did not start within {timeout:.0f} s")
        time.sleep(0.1)
    return proc.pid


def stop_seat_service(security: Path) -> bool:
    """Stop the seat service of the cluster in ``security`` and remove its file; True if it ran."""
    import psutil

    path = security / SEATS_FILE
    try:
        pid = json.loads(path.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return False
    path.unlink(missing_ok=True)
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        if "course_kit.lab.seats" in " ".join(proc.cmdline()):
            proc.kill()
            proc.wait(10)
            return True
    return False


def seat_lines(security: Path, timeout: float = 5.0) -> list[str]:
    """Return one line per seat held now (for ``lab status``); empty when none or no service."""
    path = security / SEATS_FILE
    if not path.is_file():
        return []
    try:
        sock, answer = ask_seat_service(json.loads(path.read_text()), {"op": "status"}, timeout)
        sock.close()
    except (OSError, ValueError) as exc:
        return [f"  seats: the seat service does not answer ({exc}); restart the lab"]
    seats = answer.get("seats", [])
    size = json.loads(path.read_text()).get("seat")
    lines = [f"  seats: {len(seats)} held" + (f" (seats of {size} engines)" if size else "")]
    for seat in seats:
        held = time.time() - seat["since"]
        lines.append(f"    {seat['who']}: engines {seat['ids']} for {held / 60:.0f} min")
    return lines
