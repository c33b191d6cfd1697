"""Lecture 3: Create communicators: one on this process, or one on every engine of a cluster at once."""

from __future__ import annotations

import socket
import time
from typing import Any

from course_lib.comm.communicator import Communicator
from course_lib.comm.emulated_link import EmulatedLink, emulate
from course_lib.comm.rendezvous import (
    group_error,
    interface_address,
    plan_gloo_rendezvous,
    routed_address,
)

__all__ = [
    "BACKENDS",
    "free_port",
    "make_communicator",
    "master_address",
    "rendezvous_peer",
    "routed_address",
    "setup_communicators",
]

BACKENDS = ("mpi", "gloo")


def free_port(host: str = "") -> int:
    """Return a TCP port that is free now (the OS picks it by binding port 0).

    It is free only now: another program may take it before it is used, so a caller that
    starts processes with it should retry with a new port on "address already in use".
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def make_communicator(
    backend: str,
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    timeout: float = 60.0,
    link: EmulatedLink | None = None,
    ifname: str | None = None,
    store: Any = None,
) -> Communicator:
    """Create this process's communicator for ``backend`` (``"mpi"`` or ``"gloo"``).

    ``mpi`` uses a private duplicate of ``MPI.COMM_WORLD`` (rank and size come from MPI; every
    rank must call it, and calling it again replaces a communicator that failed). ``gloo`` needs
    ``rank``, ``world_size`` and rank 0's ``master_addr:master_port``, and every rank must call
    it at once; rank 0 may pass the ``store`` it already opened on that port. With ``link``, the
    result is wrapped by :func:`emulate` and labelled as emulated.
    """
    if backend == "mpi":
        from course_lib.comm.mpi_backend import MPICommunicator

        comm: Communicator = MPICommunicator(timeout=timeout)
    elif backend == "gloo":
        from course_lib.comm.gloo_backend import init_gloo

        if rank is None or world_size is None or master_port is None:
            raise ValueError("backend='gloo' needs rank, world_size and master_port")
        comm = init_gloo(rank, world_size, master_addr, master_port, timeout, ifname, store)
    else:
        raise ValueError(f"unknown backend {backend!r}: choose one of {BACKENDS}")
    return emulate(comm, link) if link is not None else comm


def rendezvous_peer(hosts: list[str | None]) -> str | None:
    """Return the first host that is not rank 0's (``hosts[0]``), or None if all share it.

    By host name, which PCs cloned from one disk image share: :func:`setup_communicators`
    places ranks by address instead (:mod:`course_lib.comm.rendezvous`).

    Rank 0's address must be the one that *other* PCs reach it by. With ranks 0-3 on the
    controller PC and the rest on lab PCs, rank 1 sits on rank 0's own PC, so only a different
    host tells which network interface the others will come in on. Unknown hosts (None) are
    skipped.
    """
    first = hosts[0] if hosts else None
    return next((h for h in hosts[1:] if h is not None and h != first), None)


def master_address(peer_host: str | None, ifname: str | None = None) -> str:
    """Return the address rank 0 listens on for gloo, seen from the other ranks; run on rank 0.

    The host-name rule; :func:`setup_communicators` uses
    :func:`course_lib.comm.rendezvous.choose_master_address`, which goes by addresses.

    The address of ``ifname`` (``GLOO_SOCKET_IFNAME``) when given: it wins even when every rank
    reports the same host name, as PCs cloned from one disk image do. Otherwise ``127.0.0.1``
    when every rank is on this PC (``peer_host`` None), else the address of the interface that
    routes to ``peer_host``, a PC that holds other ranks.
    """
    if ifname:
        addr = interface_address(ifname)
        if addr is None:
            raise ValueError(f"network interface {ifname!r} has no IPv4 address on rank 0's PC")
        return addr
    if peer_host is None:
        return "127.0.0.1"
    try:
        peer_ip = socket.gethostbyname(peer_host)
    except OSError as exc:
        raise ValueError(
            f"rank 0 cannot resolve the host name {peer_host!r} of another rank ({exc}); "
            "pass master_addr='rank 0's IP address' or ifname='eth0' to setup_communicators"
        ) from exc
    return routed_address(peer_ip)


def _engine_create(name: str, backend: str, kwargs: dict[str, Any]) -> str:
    """Run on an engine: create the communicator and store it as ``name`` in the user namespace."""
    from IPython import get_ipython

    from course_lib.comm import rendezvous, setup

    if backend == "gloo" and kwargs.get("rank") == 0:
        kwargs = dict(kwargs, store=rendezvous.OPEN_STORES.pop(kwargs["master_port"], None))
    comm = setup.make_communicator(backend, **kwargs)
    get_ipython().user_ns[name] = comm
    return repr(comm)


def setup_communicators(
    cluster: Any,
    backend: str = "mpi",
    link: EmulatedLink | None = None,
    name: str = "comm",
    timeout: float = 60.0,
    master_addr: str | None = None,
    ifname: str | None = None,
) -> list[str]:
    """Create a communicator called ``name`` on every engine of ``cluster``; return their reprs.

    Args:
        cluster: a ``CourseCluster`` from ``start_cluster`` / ``connect_cluster``.
        backend: ``"mpi"`` (engines must be MPI ranks: ``start_cluster(kind="mpi")``) or
            ``"gloo"`` (any engines; rank 0's address and a free port are found automatically).
        link: an :class:`EmulatedLink` to slow every engine's traffic to (labelled emulated).
        master_addr: rank 0's address for gloo, when the automatic choice is wrong.
        ifname: gloo's interface on rank 0's PC (and on every PC that has one of that name),
            e.g. ``"eth0"`` or ``"Ethernet"``. Rarely needed: engines that share a PC are found
            from their addresses (not host names, which cloned PCs share), rank 0 announces its
            address on the subnet the other PCs are on, and each rank binds gloo to its own
            interface on the route to rank 0.

    Raises:
        RendezvousError: a rank cannot reach rank 0 (found by a probe of a few seconds, before
            gloo's ``timeout``) or did not join; the message names the PCs and the fix.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {BACKENDS}")
    ids = list(cluster.ids_by_rank)
    infos = [cluster.engine_info.get(eid, {}) for eid in ids]
    kwargs: dict[str, Any] = {"timeout": timeout, "link": link}
    if backend == "mpi":
        if not all(info.get("mpi_rank") is not None for info in infos):
            raise ValueError(
                "backend='mpi' needs engines that are MPI ranks; start them with "
                "start_cluster(n, kind='mpi'), or use backend='gloo' on these engines"
            )
        per_rank = [dict(kwargs) for _ in ids]
    else:
        # Rank 0 opens the store on a port the OS picks and keeps it open, so no other program
        # can take the port between choosing it and gloo using it.
        plan = plan_gloo_rendezvous(cluster, ids, ifname, master_addr, timeout)
        common = dict(kwargs, world_size=len(ids), master_addr=plan["addr"])
        per_rank = [
            dict(common, rank=rank, master_port=plan["port"], ifname=plan["ifnames"][rank])
            for rank in range(len(ids))
        ]
    # gloo's init_process_group blocks until every rank has joined, so all engines must be asked
    # at once (apply_async on each), and only then waited for.
    pending = [
        cluster.client[eid].apply_async(_engine_create, name, backend, per_rank[rank])
        for rank, eid in enumerate(ids)
    ]
    results, failures = [], []
    deadline = time.monotonic() + timeout + 30  # one wait for all: ranks join together
    for rank, result in enumerate(pending):
        try:
            results.append(result.get(timeout=max(1.0, deadline - time.monotonic())))
        except Exception as exc:  # noqa: BLE001 - every rank is waited for, then reported
            failures.append((rank, exc))
    if failures and backend == "gloo":
        raise group_error(failures, ids, plan) from failures[0][1]
    if failures:
        raise failures[0][1]
    return results
