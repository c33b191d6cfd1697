"""Lecture 3: Where gloo's ranks meet across PCs: who shares a PC, rank 0's address, each rank's interface.

Host names cannot tell PCs apart: PCs cloned from one disk image all report the same one, and
map it to ``127.0.1.1``, so gloo (which binds to whatever the host name resolves to) would listen
on loopback. Addresses can: each engine reports its network stack (the kernel's boot id and its
network namespace on Linux) and its IPv4 addresses, engines with equal reports share a PC, rank 0
announces its address on the subnet it shares with the other PCs, and every rank binds gloo to
its own interface on the route towards rank 0 (``GLOO_SOCKET_IFNAME`` per rank, since cloned PCs
need not name their interfaces alike). A quick TCP probe of rank 0's store from every rank turns
a rendezvous that cannot complete into a :class:`RendezvousError` naming the PCs, seconds after
the start instead of after gloo's whole timeout.

Kept whole: one rendezvous; each function is a step of ``plan_gloo_rendezvous``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Sequence
from typing import Any

__all__ = [
    "RendezvousError",
    "choose_master_address",
    "describe_pc",
    "group_by_pc",
    "interface_address",
    "interface_towards",
    "plan_gloo_rendezvous",
    "probe",
    "rendezvous_hint",
    "routed_address",
]

LOOPBACK = "127.0.0.1"

# Stores that rank 0's engine opened in _engine_rendezvous, by port, until the communicator's
# creation uses them (kept here because the engine's namespace belongs to the student).
OPEN_STORES: dict[int, Any] = {}


class RendezvousError(RuntimeError):
    """gloo's ranks cannot all meet: the message names the PCs that cannot and the fix."""


def routed_address(peer_ip: str) -> str:
    """Return this PC's IPv4 address on the interface that routes to ``peer_ip``."""
    # Connecting a UDP socket sends nothing; it only asks the OS which interface routes to the
    # peer, which gives this PC's address on the lab network rather than 127.0.1.1.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((peer_ip, 9))
        return sock.getsockname()[0]


def interface_address(ifname: str) -> str | None:
    """Return the IPv4 address of network interface ``ifname`` on this PC, or None."""
    import psutil

    for addr in psutil.net_if_addrs().get(ifname, []):
        if addr.family == socket.AF_INET:
            return addr.address
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def describe_pc() -> dict[str, Any]:
    """Return this process's PC: host name, network stack and ``[name, address, netmask]`` list.

    The stack is the kernel's boot id (random per boot, so cloned PCs differ) and the network
    namespace's inode (so the emulated room's PCs, which share one kernel, differ too); both are
    None off Linux, where the addresses alone tell PCs apart.
    """
    import psutil

    netns = None
    if os.path.exists("/proc/self/ns/net"):
        netns = os.stat("/proc/self/ns/net").st_ino
    interfaces = sorted(
        [name, a.address, a.netmask]
        for name, entries in psutil.net_if_addrs().items()
        for a in entries
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    )
    return {
        "host": socket.gethostname(),
        "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "netns": netns,
        "interfaces": interfaces,
    }


def _key(place: dict[str, Any]) -> tuple:
    addrs = frozenset(addr for _, addr, _ in place.get("interfaces", []))
    return place.get("boot_id"), place.get("netns"), addrs


def group_by_pc(places: Sequence[dict[str, Any]]) -> list[int]:
    """Return each rank's PC number (0 for rank 0's PC, then in order of first appearance).

    Two engines share a PC when they share a network stack and its addresses (see
    :func:`describe_pc`); their host names are not compared.
    """
    numbers: dict[tuple, int] = {}
    return [numbers.setdefault(_key(place), len(numbers)) for place in places]


def _same_subnet(addr: str, own: Sequence[Sequence[str]]) -> str | None:
    """Return the address of ``own`` (``[name, address, netmask]``) on ``addr``'s subnet."""
    for _, mine, mask in own:
        if mask and ipaddress.ip_address(addr) in ipaddress.ip_network(f"{mine}/{mask}", False):
            return mine
    return None


def choose_master_address(
    own: Sequence[Sequence[str]], peer_addrs: Sequence[str], ifname: str | None = None
) -> str:
    """Return the address rank 0 announces; run on rank 0 with its own interfaces ``own``.

    ``ifname``'s address when rank 0 has that interface; ``127.0.0.1`` when no rank sits on
    another PC (``peer_addrs`` empty); else rank 0's address on a subnet it shares with the
    peer's addresses, and failing that the address of the interface that routes to the peer.
    """
    if ifname:
        if (addr := interface_address(ifname)) is not None:
            return addr
        names = ", ".join(f"{name} ({addr})" for name, addr, _ in own) or "none but loopback"
        raise ValueError(
            f"rank 0's PC has no IPv4 interface named {ifname!r} (it has {names}): pass one of "
            "these as ifname, or leave ifname unset to let every rank find its own"
        )
    if not peer_addrs:
        return LOOPBACK
    ours = {addr for _, addr, _ in own}
    for addr in peer_addrs:  # the lab's network first: a subnet both PCs are on
        if addr not in ours and (mine := _same_subnet(addr, own)) is not None:
            return mine
    others = [addr for addr in peer_addrs if addr not in ours]
    if not others:
        raise ValueError(
            "the other PCs report only addresses rank 0's PC has too; pass master_addr="
            "'rank 0's address on the lab network'"
        )
    return routed_address(others[0])


def interface_towards(addr: str, own: Sequence[Sequence[str]]) -> str | None:
    """Return the name of this PC's interface on the route to ``addr`` (None if unknown)."""
    if addr.startswith("127."):
        return None  # every rank on this PC: gloo's default (the host name's address) works
    try:
        source = routed_address(addr)
    except OSError:
        return None
    return next((name for name, mine, _ in own if mine == source), None)


def probe(addr: str, port: int, timeout: float) -> str | None:
    """Open a TCP connection to ``addr:port`` and close it; return None, or why it failed."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s (a firewall that drops packets, or no such host)"
    except OSError as exc:
        return exc.strerror or str(exc)


def describe_for_humans(place: dict[str, Any], ifname: str | None = None) -> str:
    """Return ``host 'x', 10.0.0.3 on eth0`` for error messages."""
    addrs = ", ".join(f"{addr} on {name}" for name, addr, _ in place.get("interfaces", []))
    used = f", gloo on {ifname}" if ifname else ""
    return f"host {place.get('host', '?')!r}, {addrs or 'loopback only'}{used}"


def rendezvous_hint(master_addr: str, port: int) -> str:
    """Return the advice that ends every rendezvous error."""
    return (
        f"Fix: let every PC reach {master_addr} on TCP port {port} and on the ports above 1024 "
        f"that gloo picks (open them in the PC's firewall; `ping {master_addr}` from the PC "
        "should answer), or pass master_addr='an address of rank 0's PC that every PC "
        "reaches' / ifname='the lab network's interface on rank 0's PC' to setup_communicators"
    )


def _engine_rendezvous(
    peer_addrs: list[str], ifname: str | None, addr: str | None, world_size: int, timeout: float
) -> tuple[str, int]:
    """Run on rank 0: open the rendezvous store; return the address to announce and its port."""
    from course_lib.comm import rendezvous
    from course_lib.comm.gloo_backend import master_store

    here = rendezvous.describe_pc()
    if addr:
        rendezvous._check_own_address(addr, here)
    addr = addr or rendezvous.choose_master_address(here["interfaces"], peer_addrs, ifname)
    rendezvous.OPEN_STORES.clear()  # a store left by an earlier failed setup: close it
    store, port = master_store(addr, world_size, timeout)
    rendezvous.OPEN_STORES[port] = store
    return addr, port


def _check_own_address(addr: str, here: dict[str, Any]) -> None:
    """Raise ValueError unless ``addr`` (a name or an IPv4 address) belongs to this PC."""
    try:
        ip = socket.gethostbyname(addr)
    except OSError as exc:
        raise ValueError(f"master_addr={addr!r} does not resolve on rank 0's PC ({exc})") from None
    own = [a for _, a, _ in here["interfaces"]]
    if not ip.startswith("127.") and ip not in own:
        raise ValueError(
            f"master_addr={addr!r} ({ip}) is not an address of rank 0's PC, which has "
            f"{', '.join(own) or 'loopback only'}: pass one of these, or leave master_addr unset"
        )


def _engine_drop_store(port: int) -> None:
    """Run on rank 0: close the rendezvous store on ``port`` (a set-up that cannot complete)."""
    from course_lib.comm import rendezvous

    rendezvous.OPEN_STORES.pop(port, None)


def _engine_meet(addr: str, port: int, probe_s: float, ifname: str | None) -> dict[str, Any]:
    """Run on every rank: pick gloo's interface towards rank 0 and probe rank 0's store."""
    from course_lib.comm.rendezvous import (
        describe_pc,
        interface_address,
        interface_towards,
        probe,
    )

    here = describe_pc()
    if ifname and interface_address(ifname) is not None:
        chosen = ifname  # the instructor's choice, where this PC has it
    else:
        chosen = interface_towards(addr, here["interfaces"])
    return dict(here, ifname=chosen, error=probe(addr, port, probe_s))


def _gather(cluster: Any, ids: list[int], timeout: float, fn: Any, *args: Any) -> list[Any]:
    """Run ``fn(*args)`` on every engine of ``ids`` at once; return the results in rank order."""
    pending = [cluster.client[eid].apply_async(fn, *args) for eid in ids]
    return [result.get(timeout=timeout) for result in pending]


def _local_error(exc: Exception) -> Exception:
    """Return an engine's ValueError as a local one (the message names the fix), else ``exc``."""
    if getattr(exc, "ename", None) == "ValueError":
        return ValueError(exc.evalue)
    return exc


def plan_gloo_rendezvous(
    cluster: Any, ids: list[int], ifname: str | None, master_addr: str | None, timeout: float
) -> dict[str, Any]:
    """Find rank 0's address and store port and each rank's interface; probe before joining.

    Raises :class:`RendezvousError` naming the PCs that cannot reach rank 0's store, after a
    few seconds' probe rather than gloo's whole ``timeout``.
    """
    places = _gather(cluster, ids, timeout, describe_pc)
    pc_of = group_by_pc(places)
    peer = next((r for r, pc in enumerate(pc_of) if pc != pc_of[0]), None)
    peer_addrs = [] if peer is None else [addr for _, addr, _ in places[peer]["interfaces"]]
    try:
        addr, port = cluster.client[ids[0]].apply_sync(
            _engine_rendezvous, peer_addrs, ifname, master_addr, len(ids), timeout
        )
    except Exception as exc:
        raise _local_error(exc) from None
    probe_s = min(5.0, timeout / 4)
    met = _gather(cluster, ids, timeout + probe_s, _engine_meet, addr, port, probe_s, ifname)
    failed = [rank for rank, m in enumerate(met) if m["error"]]
    if failed:
        cluster.client[ids[0]].apply_sync(_engine_drop_store, port)
        lines = [
            f"  PC {pc_of[r] + 1} (rank {r}, engine {ids[r]}; {describe_for_humans(met[r])}): "
            f"{met[r]['error']}"
            for r in failed
        ]
        raise RendezvousError(
            f"gloo's ranks cannot all reach rank 0's rendezvous at {addr}:{port} (PC 1: "
            f"{describe_for_humans(met[0])}):\n"
            + "\n".join(lines)
            + "\n"
            + rendezvous_hint(addr, port)
        )
    return {
        "addr": addr,
        "port": port,
        "ifnames": [m["ifname"] for m in met],
        "met": met,
        "pc_of": pc_of,
    }


def group_error(failures: list[tuple[int, Exception]], ids: list[int], plan: dict) -> Exception:
    """Return a RendezvousError that names each rank that could not join, and its PC."""
    lines = []
    for rank, exc in failures:
        text = f"{getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', exc)}"
        if isinstance(exc, TimeoutError):  # the engine is still inside gloo's set-up
            text = "did not join in time (its engine stays busy until gloo's timeout passes)"
        where = describe_for_humans(plan["met"][rank], plan["ifnames"][rank])
        lines.append(
            f"  rank {rank} (engine {ids[rank]}, PC {plan['pc_of'][rank] + 1}; {where}): "
            f"{text.strip().splitlines()[0][:300]}"
        )
    return RendezvousError(
        "gloo's process group did not form:\n"
        + "\n".join(lines)
        + "\n"
        + rendezvous_hint(plan["addr"], plan["port"])
    )
