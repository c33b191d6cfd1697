"""No lecture (the grader). The bytes that went between a sandbox's processes, as the Linux kernel counted them.

A rank's communicator counts its own messages and bytes, but it counts them inside the student's
process, where an answer can rewrite the count. The operating system also counts: every TCP
socket's ``tcp_info`` holds the bytes it received (``bytes_received``), and ``ss`` reads it
from outside the sandbox, entering only its network namespace; the process that holds each
socket is found by the socket's inode in ``/proc/PID/fd``, by PID (never by the name a process
gives itself), and mapped to the sandbox's own PIDs through ``/proc/PID/status`` (``NSpid``). gloo (and the rendezvous store) talk over TCP on the sandbox's loopback, so both ends
of each connection are in the table: pairing a socket with its peer gives, per pair of processes,
the bytes one sent the other. The grader snapshots the table before and after a probe cell and
compares the difference with what the ranks said they sent
(:func:`course_grader.verdict.wire.wire_problem`).

A connection opened and closed between the two snapshots is gone from the table by the second;
its bytes are still in the loopback's own counters (``/proc/PID/net/dev``), so what crossed the
loopback but not the sockets alive at the end is counted too (:func:`unaccounted`), and must be
nothing. What it does not see: traffic relayed through a process that is not a rank (the
ipyparallel controller) and whatever does not cross the network (files, shared memory). Each
limit is named in ``docs/grading.md``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Socket",
    "ancestry",
    "flows",
    "namespace_pid",
    "settled_sockets",
    "socket_owners",
    "sockets",
    "wire_problem_here",
]

_INODE = re.compile(r"\sino:(\d+)\s")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")
_RETRANSMITTED = re.compile(r"\bbytes_retrans:(\d+)")


@dataclass(frozen=True)
class Socket:
    """One established TCP socket: its two ends, its owner, what it received and still has to send."""

    local: str
    peer: str
    pid: int  # the process that holds it (host PID, found in /proc by its inode); 0 if none
    received: int  # tcp_info.bytes_received: payload bytes that arrived, in order
    unsent: int  # Send-Q: bytes written but not yet acknowledged by the peer
    retransmitted: int = 0  # tcp_info.bytes_retrans: payload this socket sent twice or more


@functools.cache
def wire_problem_here() -> str | None:
    """Why a sandbox's sockets cannot be counted on this machine (None when they can).

    Tried once: entering this process's own network namespace and reading its sockets needs
    what entering a sandbox's does (root, CAP_SYS_ADMIN, ``ss`` and ``nsenter``).
    """
    if os.geteuid() != 0:
        return "the grader is not root, so it cannot read the sandbox's sockets"
    for tool in ("ss", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 util-linux)"
    try:
        sockets(f"/proc/{os.getpid()}/ns/net")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"entering a network namespace failed here ({exc})"[:200]
    return None


def _command(netns: str | None) -> list[str]:
    # No -p: ss would print each owner's self-chosen name (a process may call itself "pid=1"),
    # so nothing in the line comes from a process; -e gives the socket's inode instead.
    cmd = ["ss", "-tinHOe", "state", "established"]
    return ["nsenter", f"--net={netns}", *cmd] if netns else cmd


def socket_owners(netns: str | None = None) -> dict[int, int]:
    """{socket inode: host PID holding it} for the processes of the network namespace ``netns``.

    Read from ``/proc/PID/fd`` (links ``socket:[inode]``), by PID, for every process whose
    ``/proc/PID/ns/net`` is ``netns``: never from a name a process chose. A socket held by
    several processes (inherited across a fork) goes to the lowest PID.
    """
    target = os.stat(netns or f"/proc/{os.getpid()}/ns/net")
    owners: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            ns = os.stat(f"/proc/{pid}/ns/net")
            if (ns.st_ino, ns.st_dev) != (target.st_ino, target.st_dev):
                continue
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue  # gone meanwhile, or a thread's fd closed under us
        for link in links:
            if link.startswith("socket:["):
                inode = int(link[8:-1])
                owners[inode] = min(pid, owners.get(inode, pid))
    return owners


def sockets(netns: str | None = None, timeout: float = 10.0) -> dict[tuple[str, str], Socket]:
    """Every established TCP socket of the network namespace ``netns`` (a ``/proc/PID/ns/net``),
    each with the host PID that holds it (:func:`socket_owners`)."""
    out = subprocess.run(
        _command(netns), capture_output=True, text=True, timeout=timeout, check=True
    ).stdout
    owners = socket_owners(netns)
    table = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[0].isdigit() or not fields[1].isdigit():
            continue
        found = _INODE.search(line)  # after uid:N (a socket not root's) and timer:(...)
        inode = int(found.group(1)) if found else 0
        received = _RECEIVED.search(line)
        again = _RETRANSMITTED.search(line)
        table[(fields[2], fields[3])] = Socket(
            fields[2],
            fields[3],
            owners.get(inode, 0),
            int(received.group(1)) if received else 0,
            int(fields[1]),
            int(again.group(1)) if again else 0,
        )
    return table


def settled_sockets(netns: str | None = None, wait: float = 2.0) -> dict[tuple[str, str], Socket]:
    """The sockets once every byte written has arrived (or after ``wait`` seconds).

    A send returns when its bytes are in the socket's buffer, before the peer's kernel has them:
    a snapshot taken at once could miss the last message's tail.
    """
    deadline = time.monotonic() + wait
    while True:
        table = sockets(netns)
        if all(s.unsent == 0 for s in table.values()) or time.monotonic() > deadline:
            return table
        time.sleep(0.02)


def _earlier(
    before: dict[tuple[str, str], Socket], key: tuple[str, str], sock: Socket
) -> Socket | None:
    """``sock`` as it was in ``before``; None when it was opened since (or the port reused)."""
    old = before.get(key)
    return old if old is not None and old.pid == sock.pid else None


def flows(
    before: dict[tuple[str, str], Socket], after: dict[tuple[str, str], Socket]
) -> dict[tuple[int, int], int]:
    """Bytes each process sent each other one between the snapshots: {(sender, receiver): bytes}.

    Counted at the receiving socket (its peer is the sender's socket, in the same namespace); a
    socket opened since ``before`` counts from zero. A process talking to itself is left out.
    """
    out: dict[tuple[int, int], int] = {}
    for key, sock in after.items():
        sender = after.get((sock.peer, sock.local))
        if sender is None or not sock.pid or not sender.pid or sock.pid == sender.pid:
            continue
        old = _earlier(before, key, sock)
        grown = sock.received - (old.received if old else 0)
        if grown > 0:
            pair = (sender.pid, sock.pid)
            out[pair] = out.get(pair, 0) + grown
    return out


def loopback(netns: str) -> tuple[int, int]:
    """Bytes and packets sent on the loopback of ``netns`` (a ``/proc/PID/ns/net``) so far."""
    dev = Path(netns).parent.parent / "net" / "dev"
    for line in dev.read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            fields = counters.split()
            return int(fields[8]), int(fields[9])
    return 0, 0


#: What a TCP packet adds on the loopback to its payload: IPv4 (20 B) and TCP with timestamps
#: (32 B); a SYN's options take 8 B more.
PACKET_HEADERS, SYN_OPTIONS = 52, 8


def unaccounted(
    before: dict[tuple[str, str], Socket],
    after: dict[tuple[str, str], Socket],
    loopback_moved: tuple[int, int],
) -> int:
    """Bytes that crossed the loopback outside the sockets open at the end: 0 when none did.

    The loopback's byte count, less each packet's headers, less what every socket alive at the
    end received (and sent again) since ``before``, less a SYN's options per socket opened.
    What is left went over a connection that closed in between, or not over TCP at all.
    """
    nbytes, packets = loopback_moved
    carried = opened = 0
    for key, sock in after.items():
        old = _earlier(before, key, sock)
        opened += old is None
        carried += sock.received + sock.retransmitted
        carried -= old.received + old.retransmitted if old else 0
    return nbytes - PACKET_HEADERS * packets - carried - SYN_OPTIONS * opened


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value.strip()
    return fields


def namespace_pid(pid: int) -> int:
    """The PID that process ``pid`` (a host PID) has inside its own, innermost PID namespace."""
    return int(_status(pid)["NSpid"].split()[-1])


def ancestry(pid: int, depth: int = 16) -> list[int]:
    """``pid`` and its parents, as PIDs of its own namespace (the sandbox's), nearest first."""
    chain = []
    for _ in range(depth):
        try:
            status = _status(pid)
        except (OSError, KeyError):
            break
        inner = status["NSpid"].split()
        chain.append(int(inner[-1]))
        parent = int(status.get("PPid", "0"))
        if parent <= 1 or len(inner) < 2 or inner[-1] == "1":  # the sandbox's first process
            break
        pid = parent
    return chain
