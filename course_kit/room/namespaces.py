"""The emulated room (docs/instructor.md's rehearsal; lecture 3's links): The emulated room's objects: a lab PC is a network namespace, the room a bridge of them.

:class:`PC` names one PC's namespace, host name, address and the veth end left outside;
:class:`Room` holds the PCs on the instructor's bridge and runs commands inside a PC (its own
network and its own host name). :func:`run_or_raise` runs the ``ip`` / ``tc`` commands that
build, shape (:mod:`course_kit.room.shaping`) and remove
(:mod:`course_kit.room.teardown`) a room; :mod:`course_kit.room.build` builds one.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["IFNAME", "PC", "Room", "netns_inode", "run_in_pc", "run_or_raise"]

IFNAME = "eth0"  # the name of every PC's interface, as on a real lab PC


@dataclass(frozen=True)
class PC:
    """One emulated lab PC: its namespace, host name, address and the veth end left outside."""

    netns: str
    hostname: str
    ip: str
    host_veth: str
    ifname: str = IFNAME


@dataclass
class Room:
    """A running emulated room: the instructor's bridge and address, and the PCs on it."""

    tag: str
    subnet: str
    bridge: str
    instructor_ip: str
    rate: str
    pcs: list[PC] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    created: set[str] = field(default_factory=set)  # teardown deletes only these

    def command(self, pc: PC, argv: Sequence[str]) -> list[str]:
        """Return ``argv`` wrapped to run inside ``pc``: its network and its own host name."""
        # unshare --uts gives the process its own host name, so ipyparallel and course_lib see
        # PCs with different names, as in a real room; the network comes from ip netns exec.
        set_name = 'hostname "$0" && exec "$@"'
        return [
            "ip",
            "netns",
            "exec",
            pc.netns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            set_name,
            pc.hostname,
            *argv,
        ]

    def run(self, pc: PC, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``pc`` to completion (``subprocess.run`` keywords apply)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(pc, argv), **kwargs)

    def popen(self, pc: PC, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside ``pc`` in the background; it is killed when the room closes."""
        proc = subprocess.Popen(self.command(pc, argv), **kwargs)
        self.procs.append(proc)
        return proc

    @property
    def names(self) -> list[str]:
        """Return every network object of the room: namespaces, veths and the bridge."""
        return [*(pc.netns for pc in self.pcs), *(pc.host_veth for pc in self.pcs), self.bridge]


def run_in_pc(netns: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """Run ``argv`` in network namespace ``netns`` (``ip netns exec``) and return the result."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(["ip", "netns", "exec", netns, *argv], **kwargs)


def netns_inode(pid: int | str = "self") -> int:
    """Return the inode of a process's network namespace: equal inodes, same namespace."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def run_or_raise(*argv: str) -> str:
    """Run one ``ip`` / ``tc`` command and return its output; raise with its stderr if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout}")
    return done.stdout
