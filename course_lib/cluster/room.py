"""An emulated computer room on one Linux machine: network namespaces joined by a shaped bridge.

Each lab PC is a network namespace with one interface, ``eth0``, plugged into a Linux bridge in
the root namespace, which plays the instructor's PC. Every link is shaped with a token bucket
(``tc ... tbf``) in both directions, so traffic between two PCs crosses two 1 Gbit/s links, as
through a switch. Commands run inside a PC see its own network and its own host name (a fresh
UTS namespace each), and resolve every PC's name through a per-PC ``/etc/hosts``
(``ip netns exec`` mounts ``/etc/netns/NAME/hosts`` over ``/etc/hosts``)::

    with emulated_room(3) as room:
        room.run(room.pcs[0], ["ping", "-c1", room.pcs[1].ip])
        engine = room.popen(room.pcs[1], [".venv/bin/ipengine", "--file=..."])

Everything the room created (namespaces, veths, the bridge, the ``/etc/netns`` folders, and the
processes started in it) is removed on exit, also when the body raises. Needs root, ``ip``,
``tc`` and ``unshare``; :func:`room_unavailable_reason` says why a machine cannot.

One implementation serves both lifetimes: :func:`build_room` creates a room and
:func:`teardown_room` removes what it created; ``emulated_room`` pairs them in a ``with``, and
``./kit room up N`` / ``down`` (:mod:`course_lib.cluster.room_state`) call them from two commands,
keeping the room's names in a state file in between.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PC",
    "Room",
    "build_room",
    "emulated_room",
    "leftovers",
    "missing_prerequisite",
    "netns_inode",
    "room_unavailable_reason",
    "run_in_pc",
    "shape_pc",
    "teardown_room",
]

PREFIX = "10.77"  # rooms live in 10.77.X.0/24; X is picked free on this machine
IFNAME = "eth0"  # the name of every PC's interface, as on a real lab PC
LOCK = Path("/run/lock/emulated-room.lock")  # two test runs must not pick the same subnet
# tbf needs a bucket of at least one packet (and a GSO super-packet, up to 64 KiB, on veth);
# a larger bucket lets the start of each message through at memory speed and skews short
# transfers. 256 KiB is a few ms at 1 Gbit/s and keeps the rate within ~1 % for MB messages.
BURST = "256kb"
QUEUE_LATENCY = "50ms"  # tbf drops what would wait longer than this: enough for one TCP window

# The machine's DNS server is out of a PC's reach (the root namespace does not forward), so a
# lookup missing from /etc/hosts would wait for its timeout: torch's TCPStore looks up its
# peers' names and stalled 10 s that way. Nothing listens on a PC's 127.0.0.1:53, so they fail
# at once, as they would against a lab's working DNS server.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


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
        return ["ip", "netns", "exec", pc.netns, "unshare", "--uts", "sh", "-c", set_name,
                pc.hostname, *argv]  # fmt: skip

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


def _sh(*argv: str) -> str:
    """Run one ``ip`` / ``tc`` command; raise with its stderr if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


def _shape(dev: str, rate: str, burst: str, netns: str | None = None) -> None:
    """Put a token-bucket qdisc on ``dev``'s egress (tbf shapes only what a device sends)."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    _sh(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
        "burst", burst, "latency", QUEUE_LATENCY)  # fmt: skip


def shape_pc(room: Room, pc: PC, rate: str, burst: str = BURST) -> None:
    """Reshape both directions of ``pc``'s link to ``rate`` (a PC left at ``"100mbit"``)."""
    if pc not in room.pcs:
        raise ValueError(f"{pc.netns} is not a PC of room {room.tag}: pass one of room.pcs")
    _shape(pc.host_veth, rate, burst)  # switch -> PC
    _shape(pc.ifname, rate, burst, pc.netns)  # PC -> switch


def _used_subnets() -> set[int]:
    """Return the X of every 10.77.X.* address or route already on this machine."""
    text = _sh("ip", "-4", "-o", "addr") + _sh("ip", "-4", "route")
    used = set()
    for word in text.split():
        if word.startswith(PREFIX + "."):
            used.add(int(word.split(".")[2]))
    return used


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _hosts_file(room: Room) -> str:
    """Return the /etc/hosts every PC sees: localhost, the instructor and all PCs by name.

    A name several PCs share (PCs cloned from one disk image) maps to ``127.0.1.1``, as the
    Debian installer writes it into each clone's own /etc/hosts.
    """
    lines = [
        "127.0.0.1 localhost",
        "::1 localhost ip6-localhost",
        f"{room.instructor_ip} {socket.gethostname()} instructor",
    ]
    names = [pc.hostname for pc in room.pcs]
    lines += [f"{pc.ip} {pc.hostname}" for pc in room.pcs if names.count(pc.hostname) == 1]
    lines += [f"127.0.1.1 {name}" for name in sorted({n for n in names if names.count(n) > 1})]
    return "\n".join(lines) + "\n"


def _kill_namespace_processes(room: Room, grace: float = 3.0) -> None:
    """Stop what the room started (by pid), then anything else left in its namespaces."""
    pids: set[int] = set()
    for proc in room.procs:
        if proc.poll() is None:
            pids.add(proc.pid)
    for pc in (pc for pc in room.pcs if pc.netns in room.created):
        # Processes a command forked (an engine's children) live in the namespace too.
        done = subprocess.run(["ip", "netns", "pids", pc.netns], capture_output=True, text=True)
        pids.update(int(p) for p in done.stdout.split() if p.strip().isdigit())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        for proc in room.procs:  # reap our own children, or they stay as zombies
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        pids = {pid for pid in pids if _alive(pid)}
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def teardown_room(room: Room) -> list[str]:
    """Remove everything ``room`` created, and stop what runs in its PCs; return what is left.

    Only names in ``room.created`` are deleted (never a stranger's with a clashing name); every
    step is tried, and the returned list says what could not be removed (empty: all gone).
    """
    errors = []
    steps = [lambda: _kill_namespace_processes(room)]
    ours = [name for name in room.names if name in room.created]  # never a clashing stranger
    for pc in room.pcs:
        # Deleting the namespace destroys the veth end inside it, and with it the pair; the
        # host end is deleted by hand only if the namespace never got its end.
        if pc.netns in ours:
            steps.append(functools.partial(_delete, "netns", pc.netns))
            steps.append(functools.partial(shutil.rmtree, f"/etc/netns/{pc.netns}", True))
    veths = [pc.host_veth for pc in room.pcs if pc.host_veth in ours]
    steps.append(lambda: _wait_until_gone(veths, within=2.0))
    steps += [functools.partial(_delete, "link", veth) for veth in veths]
    if room.bridge in ours:
        steps.append(functools.partial(_delete, "link", room.bridge))
    steps.append(_remove_netns_folder_if_empty)
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - every other step must still run
            errors.append(f"{type(exc).__name__}: {exc}")
    errors += [f"left behind: {name}" for name in _wait_until_gone(ours)]
    return errors


_ROOMS = itertools.count()


def _new_tag() -> str:
    """Return a tag unique on this machine now: this pid and a counter, in base 36 (7 chars)."""
    # Interface names have at most 15 characters ("rv" + tag + "p12"); a pid is < 2**22,
    # five base-36 digits, and the counter adds two.
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"

    def base36(n: int, width: int) -> str:
        return "".join(digits[(n // 36**i) % 36] for i in reversed(range(width)))

    return base36(os.getpid(), 5) + base36(next(_ROOMS), 2)


def _remove_netns_folder_if_empty() -> None:
    with contextlib.suppress(OSError):  # not empty: another room (or the admin) uses it
        os.rmdir("/etc/netns")


def _delete(kind: str, name: str) -> None:
    """Delete namespace or link ``name`` if it exists (it may vanish meanwhile: that is fine)."""
    if name in leftovers([name]):
        done = subprocess.run(["ip", kind, "del", name], capture_output=True, text=True)
        if done.returncode != 0 and name in leftovers([name]):
            raise RuntimeError(f"`ip {kind} del {name}` failed: {done.stderr.strip()}")


def _wait_until_gone(names: Sequence[str], within: float = 5.0) -> list[str]:
    """Return those of ``names`` still present after ``within`` seconds."""
    # The kernel destroys a namespace, and the veth pair inside it, after `ip netns del`
    # returns, so the host end of a pair disappears a moment later.
    deadline = time.monotonic() + within
    while (left := leftovers(names)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def leftovers(names: Sequence[str]) -> list[str]:
    """Return those of ``names`` that still exist as a network namespace or a link."""
    namespaces = {line.split()[0] for line in _sh("ip", "netns", "list").splitlines() if line}
    links = set()
    for line in _sh("ip", "-o", "link").splitlines():
        links.add(line.split(":")[1].strip().split("@")[0])
    return [name for name in names if name in namespaces or name in links]


def _check_ifnames(ifnames: Sequence[str], n_pcs: int) -> None:
    if len(ifnames) != n_pcs:
        raise ValueError(f"ifnames has {len(ifnames)} names for {n_pcs} PCs: give one per PC")
    for name in ifnames:
        if not 1 <= len(name) <= 15 or name == "lo" or not name.replace("-", "").isalnum():
            raise ValueError(
                f"interface name {name!r}: use 1-15 letters and digits other than 'lo', "
                "e.g. 'eth0', 'enp3s0', 'eno1'"
            )


def build_room(
    n_pcs: int,
    rate: str = "1gbit",
    burst: str = BURST,
    tag: str | None = None,
    hostname: str | None = None,
    ifnames: Sequence[str] | None = None,
) -> Room:
    """Create ``n_pcs`` PCs on a bridge with every link shaped to ``rate``; return the Room.

    The bridge (the instructor's PC, the root namespace) gets ``10.77.X.1/24``, PC ``k``
    (``room.pcs[k - 1]``, namespace ``pc{k}_{tag}``) gets ``10.77.X.{k+1}`` on ``eth0`` with a
    default route through the instructor, so it also reaches the machine's other addresses.
    ``rate`` and ``burst`` are tbf's (``"1gbit"``, ``"100mbit"``; ``"256kb"``). ``hostname``
    gives every PC that one host name, and ``ifnames`` each PC its interface's name, as in a
    room of PCs cloned from one disk image onto different hardware. The room stays up until
    :func:`teardown_room`; if building fails, what was built is removed first.
    """
    if not 1 <= n_pcs <= 200:
        raise ValueError(f"n_pcs={n_pcs}: use 1..200 PCs")
    if ifnames is not None:
        _check_ifnames(ifnames, n_pcs)
    tag = tag or _new_tag()
    room = Room(tag=tag, subnet="", bridge=f"rbr{tag}", instructor_ip="", rate=rate)
    try:
        with _subnet_lock():
            used = _used_subnets()
            free = [x for x in range(10, 250) if x not in used]
            if not free:
                raise RuntimeError(f"no free {PREFIX}.X.0/24 subnet for a room on this machine")
            x = free[os.getpid() % len(free)]
            room.subnet = f"{PREFIX}.{x}.0/24"
            room.instructor_ip = f"{PREFIX}.{x}.1"
            _sh("ip", "link", "add", room.bridge, "type", "bridge")
            room.created.add(room.bridge)
            _sh("ip", "addr", "add", f"{room.instructor_ip}/24", "dev", room.bridge)
        _sh("ip", "link", "set", room.bridge, "up")
        for k in range(1, n_pcs + 1):
            pc = PC(netns=f"pc{k}_{tag}", hostname=hostname or f"pc{k}-{tag}",
                    ip=f"{PREFIX}.{x}.{k + 1}", host_veth=f"rv{tag}p{k}",
                    ifname=ifnames[k - 1] if ifnames else IFNAME)  # fmt: skip
            room.pcs.append(pc)
            inner = f"rv{tag}q{k}"  # renamed to eth0 once inside the namespace
            _sh("ip", "netns", "add", pc.netns)
            room.created.add(pc.netns)
            _sh("ip", "link", "add", pc.host_veth, "type", "veth", "peer", "name", inner)
            room.created.add(pc.host_veth)
            _sh("ip", "link", "set", inner, "netns", pc.netns)
            ns = ("ip", "netns", "exec", pc.netns)
            _sh(*ns, "ip", "link", "set", inner, "name", pc.ifname)
            _sh(*ns, "ip", "addr", "add", f"{pc.ip}/24", "dev", pc.ifname)
            _sh(*ns, "ip", "link", "set", pc.ifname, "up")
            _sh(*ns, "ip", "link", "set", "lo", "up")
            _sh(*ns, "ip", "route", "add", "default", "via", room.instructor_ip)
            _sh("ip", "link", "set", pc.host_veth, "master", room.bridge)
            _sh("ip", "link", "set", pc.host_veth, "up")
            _shape(pc.host_veth, rate, burst)  # instructor / switch -> PC
            _shape(pc.ifname, rate, burst, pc.netns)  # PC -> switch
        for pc in room.pcs:
            folder = Path("/etc/netns") / pc.netns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(_hosts_file(room))
            (folder / "resolv.conf").write_text(RESOLV_CONF)
    except BaseException:
        errors = teardown_room(room)
        if errors:
            raise RuntimeError(f"room set-up failed and teardown left: {errors}") from None
        raise
    return room


@contextlib.contextmanager
def emulated_room(
    n_pcs: int,
    rate: str = "1gbit",
    burst: str = BURST,
    hostname: str | None = None,
    ifnames: Sequence[str] | None = None,
) -> Iterator[Room]:
    """Yield a room built by :func:`build_room`; remove all of it on exit, also on error."""
    room = build_room(n_pcs, rate, burst, hostname=hostname, ifnames=ifnames)
    body_failed = True
    try:
        yield room
        body_failed = False
    finally:
        errors = teardown_room(room)
        if errors and not body_failed:
            raise RuntimeError(f"room teardown failed: {'; '.join(errors)}")


def missing_prerequisite() -> str | None:
    """Return what this machine lacks for a room (root, ``ip``, ``tc``...) and the fix, or None."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        return "needs Linux network namespaces: run it on a Linux machine (or a Linux VM)"
    if os.geteuid() != 0:
        return "needs root for network namespaces, veths and tc qdiscs: run it with sudo"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed: install {package} (apt install {package})"
    return None


@functools.cache
def room_unavailable_reason() -> str | None:
    """Return why this machine cannot host an emulated room, or None when it can."""
    if (missing := missing_prerequisite()) is not None:
        return missing
    try:
        with emulated_room(1) as room:
            done = room.run(room.pcs[0], ["hostname"], timeout=10)
            if done.returncode != 0 or done.stdout.strip() != room.pcs[0].hostname:
                return f"cannot run a command inside a PC: {done.stderr.strip() or done.stdout}"
    except Exception as exc:  # noqa: BLE001 - any failure means "no room here", with the reason
        return f"cannot build an emulated room here: {exc}"
    return None
