"""Benchmark ``./kit lab start`` on Slurm: seconds until every engine answers, queue time apart.

Builds an emulated room of N PCs with a real Slurm across them (``./kit room up N --slurm``:
Debian's ``slurm-wlm`` and ``munge``, a ``slurmd`` per PC; ``course_kit/room/slurm.py``),
then times the Slurm lab's start (the controller here, the engines as one ``sbatch`` job through
ipyparallel's Slurm launcher) and stop, repeatedly. The time the job waited in the queue (until
``scontrol`` first reports it RUNNING, polled every second) is shown apart from the rest. Beside
it, a local ``start_cluster`` of the same size. Prints medians and the ratio of Slurm's start,
queue excluded, to the local one (aim: at most 1.5x). Needs root, ``ip``, ``tc``, ``unshare``,
``slurm-wlm`` and ``munge``.

    .venv/bin/python bench/bench_slurm_startup.py               # 3 nodes x 2 engines, 3 repeats
    .venv/bin/python bench/bench_slurm_startup.py --nodes 3 --per-node 1 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_kit.lab.slurm import (  # noqa: E402
    read_slurm_lab,
    start_slurm_lab,
    stop_slurm_lab,
)
from course_kit.room.build import room_unavailable_reason  # noqa: E402
from course_kit.room.slurm import slurm_unavailable_reason  # noqa: E402
from course_kit.room.state import lab_folder, room_down, room_up  # noqa: E402
from course_lib.cluster import start_cluster  # noqa: E402


def time_slurm(nodes: int, per_node: int, repeats: int) -> list[tuple[float, float]]:
    """Return (seconds until every engine answers, seconds of it in the queue) per start."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["IPYTHONDIR"] = str(Path(tmp) / "ipython")
        state = Path(tmp) / "room.json"
        room_up(nodes, state_file=state, engines=per_node, slurm=True)
        try:
            lab = read_slurm_lab(lab_folder(state) / "slurm.toml")
            for _ in range(repeats):
                started, running = time.monotonic(), []

                def progress(line: str, started: float = started, running: list = running) -> None:
                    if "RUNNING" in line and not running:
                        running.append(time.monotonic() - started)

                _, seconds = start_slurm_lab(lab, progress=progress)
                stop_slurm_lab(lab)
                runs.append((seconds, running[0] if running else 0.0))
                time.sleep(2)  # Slurm ends the job's steps before the next job fits
        finally:
            room_down(state)
    return runs


def time_local(n: int, repeats: int) -> list[float]:
    """Return the seconds of ``start_cluster(n)`` on this machine, per start."""
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        with start_cluster(n=n, timeout=300):
            times.append(time.monotonic() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--per-node", type=int, default=2, help="engines per node")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for reason in (room_unavailable_reason(), slurm_unavailable_reason()):
        if reason is not None:
            print(f"bench_slurm_startup: skipped, no Slurm in an emulated room here: {reason}")
            return 0
    n = args.nodes * args.per_node
    runs = time_slurm(args.nodes, args.per_node, args.repeats)
    total = statistics.median(t for t, _ in runs)
    queued = statistics.median(q for _, q in runs)
    after_queue = statistics.median(t - q for t, q in runs)
    shown = ", ".join(f"{t:.1f} (queue {q:.1f})" for t, q in runs)
    print(
        f"Slurm lab start, {args.nodes} nodes x {args.per_node} engines: median {total:.1f} s "
        f"until every engine answers, of which {queued:.1f} s in the queue; {after_queue:.1f} s "
        f"without it (runs: {shown})",
        flush=True,
    )
    local = time_local(n, args.repeats)
    local_s = statistics.median(local)
    print(
        f"local start_cluster({n}) on this machine: median {local_s:.1f} s "
        f"(runs: {', '.join(f'{t:.1f}' for t in local)}); ratio Slurm (queue excluded) / local "
        f"{after_queue / local_s:.2f} (aim <= 1.5)"
    )
    print(f"{os.cpu_count()} CPU cores here, shared by every node of the room")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
