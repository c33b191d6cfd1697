"""Measure what gloo puts on the wire around the kit's messages: the figures the grader's byte check rests on.

Starts local engines with gloo communicators and reads the socket table
(:mod:`course_grader.sandbox.wire_audit`) around four kinds of traffic: point-to-point messages
of several sizes from rank 0 to rank 1 (the bytes beyond the payload, per message, each way),
built-in allreduce and allgather (gloo's rings: which neighbour gets the chunks, the bytes per
message beyond them, the kit's agreement on every pair), a broadcast (gloo's tree), barriers (the bytes per pair of
ranks), and nothing at all (what idle engines send each other).
:mod:`course_grader.verdict.claims` allows 232 B per message sent and 104 B back, 200 B and
104 B a message of a ring, 40-200 B a pair of agreement per call, 40-400 B a pair per barrier;
this prints what this machine's gloo does. Needs root (``ss -p`` on the engines' sockets).

    .venv/bin/python bench/bench_wire_framing.py            # 3 and 4 engines
    .venv/bin/python bench/bench_wire_framing.py --engines 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_grader.sandbox.wire_audit import flows, settled_sockets, sockets  # noqa: E402
from course_lib.cluster import start_cluster  # noqa: E402
from course_lib.comm import setup_communicators  # noqa: E402


def _send(size: int, count: int) -> None:
    """On every engine: rank 0 sends ``count`` messages of ``size`` float32 to rank 1."""
    import numpy as np
    from IPython import get_ipython

    comm = get_ipython().user_ns["comm"]
    x = np.ones(size, np.float32)
    for _ in range(count):
        if comm.rank == 0:
            comm.send(x, 1)
        elif comm.rank == 1:
            comm.recv(x, 0)


def _builtin(name: str, size: int, count: int) -> None:
    """On every engine: ``count`` calls of the built-in ``name`` on ``size`` float32."""
    import numpy as np
    from IPython import get_ipython

    comm = get_ipython().user_ns["comm"]
    x = np.ones(size, np.float32)
    for _ in range(count):
        getattr(comm, name)(x)


def _barriers(count: int) -> None:
    from IPython import get_ipython

    comm = get_ipython().user_ns["comm"]
    for _ in range(count):
        comm.barrier()


def _between_ranks(cluster, job, *args) -> dict[tuple[int, int], int]:
    """Bytes each rank sent each other one while ``job`` ran on every engine."""
    rank_of = {pid: rank for rank, pid in enumerate(cluster.run(os.getpid))}
    before = sockets()
    if job is None:
        time.sleep(2.0)
    else:
        cluster.run(job, *args, timeout=60)
    moved = flows(before, settled_sockets())
    return {
        (rank_of[a], rank_of[b]): n for (a, b), n in moved.items() if a in rank_of and b in rank_of
    }


def _ring_line(engines: int, name: str, way: int, size: int, moved: dict, count: int) -> None:
    """Print a built-in's bytes a call: along gloo's ring, back, and between ranks further apart."""
    p, nbytes = engines, 4 * size
    if name == "allgather":
        messages, payload = p - 1, (p - 1) * nbytes
    else:
        messages, payload = 2 * (p - 1), 2 * (p - 1) * nbytes / p
    along = sum(moved.get((r, (r + way) % p), 0) for r in range(p)) / (p * count)
    back = sum(moved.get((r, (r - way) % p), 0) for r in range(p)) / (p * count)
    apart = [n / count for (a, b), n in moved.items() if (b - a) % p not in (1, p - 1)]
    agree = min(apart) if apart else 184  # with 3 engines every pair is a neighbour
    print(
        f"{engines} engines, {name} of {size} float32: {along:.0f} B a call to rank r {way:+d} "
        f"({(along - payload - agree) / messages:.1f} B a message beyond {payload:.0f} B of "
        f"chunks and {agree:.0f} B of agreement), {(back - agree) / messages:.1f} B a message "
        f"back"
        + (f", {min(apart):.0f}-{max(apart):.0f} B on the pairs further apart" if apart else "")
    )


def measure(engines: int, count: int = 10) -> None:
    """Print the framing per message, the bytes per barrier and the idle traffic on ``engines``."""
    cluster = start_cluster(n=engines)
    try:
        setup_communicators(cluster, backend="gloo", timeout=30)
        for size in (10, 1001, 4096, 65536):
            moved = _between_ranks(cluster, _send, size, count)
            out = (moved.get((0, 1), 0) - 4 * size * count) / count
            back = moved.get((1, 0), 0) / count
            print(
                f"{engines} engines, {count} messages of {size} float32: "
                f"{out:.1f} B a message beyond the payload, {back:.1f} B back"
            )
        for name, way in (("allreduce", -1), ("allgather", +1)):
            for size in (1000, 100000):
                _ring_line(
                    engines,
                    name,
                    way,
                    size,
                    _between_ranks(cluster, _builtin, name, size, count),
                    count,
                )
        size = 100000
        moved = _between_ranks(cluster, _builtin, "broadcast", size, count)
        carried = sorted((a, b) for (a, b), n in moved.items() if n > 4 * size * count)
        agree = min(moved.values()) / count
        down = [moved[pair] / count - 4 * size - agree for pair in carried]
        up = [moved[(b, a)] / count - agree for a, b in carried]
        print(
            f"{engines} engines, broadcast of {size} float32 from rank 0: down {carried}, "
            f"{max(down):.1f} B a message beyond the buffer and {agree:.0f} B of agreement, "
            f"{max(up):.1f} B back"
        )
        moved = _between_ranks(cluster, _barriers, count)
        per_pair = sorted(n / count for n in moved.values())
        print(
            f"{engines} engines, a barrier: {per_pair[0]:.0f}-{per_pair[-1]:.0f} B a pair "
            f"({len(per_pair)} pairs)"
        )
        idle = sum(_between_ranks(cluster, None).values())
        print(f"{engines} engines, idle for 2 s: {idle} B between ranks")
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="*", default=[3, 4])
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_wire_framing: run as root (ss names the engines' sockets only for root)")
        return 1
    for engines in args.engines:
        measure(engines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
