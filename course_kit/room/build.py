"""The emulated room (docs/instructor.md's rehearsal; lecture 3's links): An emulated computer room on one Linux machine: network namespaces joined by a shaped bridge.

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
``./kit room up N`` / ``down`` (:mod:`course_kit.room.state`) call them from two commands,
keeping the room's names in a state file in between. The room's objects and the commands run in
them are in :mod:`course_kit.room.namespaces`, the link shaping in
:mod:`course_kit.room.shaping`, the removal in :mod:`course_kit.room.teardown`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import os
import shutil
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

from course_kit.room.namespaces import (
    IFNAME,
    PC,
    Room,
    netns_inode,
    run_in_pc,
    run_or_raise,
)
from course_kit.room.shaping import BURST, shape_link, shape_pc
from course_kit.room.teardown import leftovers, teardown_room

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
LOCK = Path("/run/lock/emulated-room.lock")  # two test runs must not pick the same subnet

# The machine's DNS server is out of a PC's reach (the root namespace does not forward), so a
# lookup missing from /etc/hosts would wait for its timeout: torch's TCPStore looks up its
# peers' names and stalled 10 s that way. Nothing listens on a PC's 127.0.0.1:53, so they fail
# at once, as they would against a lab's working DNS server.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def _used_subnets() -> set[int]:
    """Return the X of every 10.77.X.* address or route already on this machine."""
    text = run_or_raise("ip", "-4", "-o", "addr") + run_or_raise("ip", "-4", "route")
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


_ROOMS = itertools.count()


def _new_tag() -> str:
    """Return a tag unique on this machine now: this pid and a counter, in base 36 (7 chars)."""
    # Interface names have at most 15 characters ("rv" + tag + "p12"); a pid is < 2**22,
    # five base-36 digits, and the counter adds two.
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"

    def base36(n: int, width: int) -> str:
        return "".join(digits[(n // 36**i) % 36] for i in reversed(range(width)))

    return base36(os.getpid(), 5) + base36(next(_ROOMS), 2)


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
            run_or_raise("ip", "link", "add", room.bridge, "type", "bridge")
            room.created.add(room.bridge)
            run_or_raise("ip", "addr", "add", f"{room.instructor_ip}/24", "dev", room.bridge)
        run_or_raise("ip", "link", "set", room.bridge, "up")
        for k in range(1, n_pcs + 1):
            pc = PC(
                netns=f"pc{k}_{tag}",
                hostname=hostname or f"pc{k}-{tag}",
                ip=f"{PREFIX}.{x}.{k + 1}",
                host_veth=f"rv{tag}p{k}",
                ifname=ifnames[k - 1] if ifnames else IFNAME,
            )
            room.pcs.append(pc)
            inner = f"rv{tag}q{k}"  # renamed to eth0 once inside the namespace
            run_or_raise("ip", "netns", "add", pc.netns)
            room.created.add(pc.netns)
            run_or_raise("ip", "link", "add", pc.host_veth, "type", "veth", "peer", "name", inner)
            room.created.add(pc.host_veth)
            run_or_raise("ip", "link", "set", inner, "netns", pc.netns)
            ns = ("ip", "netns", "exec", pc.netns)
            run_or_raise(*ns, "ip", "link", "set", inner, "name", pc.ifname)
            run_or_raise(*ns, "ip", "addr", "add", f"{pc.ip}/24", "dev", pc.ifname)
            run_or_raise(*ns, "ip", "link", "set", pc.ifname, "up")
            run_or_raise(*ns, "ip", "link", "set", "lo", "up")
            run_or_raise(*ns, "ip", "route", "add", "default", "via", room.instructor_ip)
            run_or_raise("ip", "link", "set", pc.host_veth, "master", room.bridge)
            run_or_raise("ip", "link", "set", pc.host_veth, "up")
            shape_link(pc.host_veth, rate, burst)  # instructor / switch -> PC
            shape_link(pc.ifname, rate, burst, pc.netns)  # PC -> switch
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
