"""Create communicators: one on this process, or one on every engine of a cluster at once."""

from __future__ import annotations

import socket
from typing import Any

from course_lib.comm.communicator import Communicator
from course_lib.comm.emulated_link import EmulatedLink, emulate

__all__ = ["BACKENDS", "free_port", "make_communicator", "setup_communicators"]

BACKENDS = ("mpi", "gloo")


def free_port(host: str = "") -> int:
    """Return a TCP port that is free now (the OS picks it by binding port 0)."""
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
) -> Communicator:
    """Create this process's communicator for ``backend`` (``"mpi"`` or ``"gloo"``).

    ``mpi`` uses ``MPI.COMM_WORLD`` (rank and size come from MPI). ``gloo`` needs ``rank``,
    ``world_size`` and rank 0's ``master_addr:master_port``, and every rank must call it at once.
    With ``link``, the result is wrapped by :func:`emulate` and labelled as emulated.
    """
    if backend == "mpi":
        from course_lib.comm.mpi_backend import MPICommunicator

        comm: Communicator = MPICommunicator(timeout=timeout)
    elif backend == "gloo":
        from course_lib.comm.gloo_backend import init_gloo

        if rank is None or world_size is None or master_port is None:
            raise ValueError("backend='gloo' needs rank, world_size and master_port")
        comm = init_gloo(rank, world_size, master_addr, master_port, timeout, ifname)
    else:
        raise ValueError(f"unknown backend {backend!r}: choose one of {BACKENDS}")
    return emulate(comm, link) if link is not None else comm


def _engine_create(name: str, backend: str, kwargs: dict[str, Any]) -> str:
    """Run on an engine: create the communicator and store it as ``name`` in the user namespace."""
    from IPython import get_ipython

    from course_lib.comm.setup import make_communicator

    comm = make_communicator(backend, **kwargs)
    get_ipython().user_ns[name] = comm
    return repr(comm)


def _engine_rendezvous(peer_host: str | None) -> tuple[str, int]:
    """Run on rank 0: return an address the other engines can reach, and a free port."""
    import socket

    from course_lib.comm.setup import free_port

    if peer_host is None:
        return "127.0.0.1", free_port("127.0.0.1")
    # Connecting a UDP socket sends nothing; it only asks the OS which interface routes to the
    # peer, which gives this PC's address on the lab network rather than 127.0.1.1.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((socket.gethostbyname(peer_host), 9))
        addr = sock.getsockname()[0]
    return addr, free_port(addr)


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
        ifname: ``GLOO_SOCKET_IFNAME`` for gloo across PCs, e.g. ``"eth0"`` or ``"Ethernet"``.
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
        hosts = {info.get("host") for info in infos}
        peer_host = None if len(hosts) <= 1 else infos[1].get("host")
        addr, port = cluster.client[ids[0]].apply_sync(_engine_rendezvous, peer_host)
        addr = master_addr or addr
        common = dict(
            kwargs, world_size=len(ids), master_addr=addr, master_port=port, ifname=ifname
        )
        per_rank = [dict(common, rank=rank) for rank in range(len(ids))]
    # gloo's init_process_group blocks until every rank has joined, so all engines must be asked
    # at once (apply_async on each), and only then waited for.
    pending = [
        cluster.client[eid].apply_async(_engine_create, name, backend, per_rank[rank])
        for rank, eid in enumerate(ids)
    ]
    return [result.get(timeout=timeout + 30) for result in pending]
