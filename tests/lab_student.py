"""A student's notebook, as a process: ``python lab_student.py OUT N [hold|train|exit]``.

Run by ``tests/kit/room/test_room_seats.py`` inside a PC of the emulated room with ``COURSE_CLUSTER_FILE``
set, as a student's kernel in the lab would be: it asks ``start_cluster(n=N)`` for engines,
writes which it got to ``OUT/ready-<pid>.json``, and with ``train`` waits for ``OUT/go`` and runs
lecture 4's data-parallel check network with the ring, saving the weights to ``OUT/weights-<pid>.npz``.
``exit`` ends the process without closing the client (a kernel that died); otherwise it closes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from course_lib.checks.lecture04 import CHECK_CONFIG, check_digits, check_net
from course_lib.cluster import start_cluster


def main() -> None:
    out, n, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    cluster = start_cluster(n=n, timeout=120)
    ready = {
        "kind": cluster.kind,
        "ids": cluster.ids_by_rank,
        "where": cluster.where(),
        "hosts": [cluster.engine_info[e]["host"] for e in cluster.ids_by_rank],
    }
    (out / f"ready-{os.getpid()}.json").write_text(json.dumps(ready))
    if mode == "hold":
        cluster.stop()
        return
    deadline = time.monotonic() + 600
    while not (out / "go").exists():
        assert time.monotonic() < deadline, "no go"
        time.sleep(0.2)
    from course_lib.parallel.data_parallel.train import train_data_parallel

    result = train_data_parallel(
        cluster,
        model=check_net,
        dataset=check_digits,
        config=CHECK_CONFIG,
        method="ring",
        timeout=400,
    )
    np.savez(out / f"weights-{os.getpid()}.npz", **result.weights)
    if mode == "exit":
        os._exit(0)  # no cluster.stop(): the seat must go back when the connection drops
    cluster.stop()


if __name__ == "__main__":
    main()
