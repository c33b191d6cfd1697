"""Lecture 3: Engine-to-engine communication: one Communicator interface, mpi and gloo backends, an emulated link.

::

    comm = MPICommunicator()                 # on MPI ranks
    comm = init_gloo(rank, world_size, addr, port)  # anywhere, over TCP
    slow = emulate(comm, EmulatedLink(bandwidth=125e6, latency=50e-6))
    setup_communicators(cluster, backend="gloo")    # from a notebook: `comm` on every engine
"""

from course_lib.comm.buffers import Buffer, as_flat_array, chunk_bounds
from course_lib.comm.communicator import (
    CommError,
    CommMismatchError,
    CommTimeoutError,
    Communicator,
    Handle,
    wait_all,
)
from course_lib.comm.emulated_link import GIGABIT, EmulatedLink, emulate
from course_lib.comm.rendezvous import RendezvousError
from course_lib.comm.setup import BACKENDS, free_port, make_communicator, setup_communicators
from course_lib.comm.stats import CommStats, PeerStats
from course_lib.comm.wire import collective_wire_bytes, wire_bytes

__all__ = [
    "BACKENDS",
    "GIGABIT",
    "Buffer",
    "CommError",
    "CommMismatchError",
    "CommStats",
    "CommTimeoutError",
    "Communicator",
    "EmulatedLink",
    "Handle",
    "PeerStats",
    "RendezvousError",
    "as_flat_array",
    "chunk_bounds",
    "collective_wire_bytes",
    "emulate",
    "free_port",
    "make_communicator",
    "setup_communicators",
    "wait_all",
    "wire_bytes",
]
