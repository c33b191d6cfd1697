"""The emulated room (docs/instructor.md's rehearsal; lecture 3's links): A cluster whose engines run in the PCs of an emulated room: real TCP through shaped links.

As an instructor does it in a lab: the controller on the instructor's PC (here the machine's own
network namespace, listening on every address), and ``ipengine --file=...`` on each PC (here a
network namespace behind a 1 Gbit/s ``tc tbf`` link, see :mod:`course_kit.room.build`)::

    with room_cluster(4, rate="1gbit") as cluster:      # root, ip, tc and unshare needed
        train_data_parallel(cluster, ..., method="ring")  # gradients cross the shaped links

Benchmarks use it to measure what the emulated link only models.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from course_kit.room.build import emulated_room, room_unavailable_reason
from course_lib.cluster.course_cluster import CourseCluster
from course_lib.cluster.launch import connect_cluster

__all__ = ["room_cluster"]

BIN = Path(sys.executable).parent  # ipcluster / ipengine of the running environment


@contextlib.contextmanager
def room_cluster(
    n_pcs: int, rate: str = "1gbit", timeout: float = 120.0
) -> Iterator[CourseCluster]:
    """Yield a connected cluster of ``n_pcs`` engines, one per PC of a room with ``rate`` links.

    Everything started (room, controller, engines) is stopped and removed on exit. Raises
    RuntimeError naming the reason where no room can be built (not root, no ``ip`` / ``tc``).
    """
    reason = room_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"cannot build an emulated room here: {reason}")
    work = Path(tempfile.mkdtemp(prefix="course-room-cluster-"))
    env = dict(os.environ, IPYTHONDIR=str(work / "instructor"))
    security = work / "instructor" / "profile_lab" / "security"
    ipcluster = [str(BIN / "ipcluster")]
    with contextlib.ExitStack() as stack:
        room = stack.enter_context(emulated_room(n_pcs, rate=rate))
        subprocess.run(
            ipcluster + ["start", "--profile=lab", "-n", "0", "--daemonize", "--ip=*"],
            env=env,
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        stack.callback(
            subprocess.run,
            ipcluster + ["stop", "--profile=lab"],
            env=env,
            capture_output=True,
            timeout=60,
        )
        engine_file = security / "ipcontroller-engine.json"
        for i, pc in enumerate(room.pcs):
            log = stack.enter_context(open(work / f"engine{i}.log", "w"))  # noqa: SIM115
            # Each PC has its own home: its engine must not share the instructor's profile.
            pc_env = dict(os.environ, IPYTHONDIR=str(work / f"pc{i}"), OMP_NUM_THREADS="1")
            room.popen(
                pc,
                [str(BIN / "ipengine"), f"--file={engine_file}"],
                env=pc_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        cluster = connect_cluster(
            connection_file=str(security / "ipcontroller-client.json"), n=n_pcs, timeout=timeout
        )
        stack.callback(cluster.stop)
        yield cluster
