"""Benchmark ``./kit lab start``: seconds until every engine on every PC answers.

Builds an emulated room of N PCs (see ``course_kit/room/build.py``), writes a hosts file
whose ``ssh`` / ``scp`` are the room's stand-ins (``course_kit/room/ssh.py``), and times
``python -m course_kit.jobs.cluster lab start`` (controller here, engines through ipyparallel's SSH
launcher), then ``stop``; beside it, a local ``start_cluster`` of the same size on this machine.
Prints the medians over the repeats and their ratio. Needs root, ``ip``, ``tc``, ``unshare``.

    .venv/bin/python bench/bench_lab_start.py               # 4 PCs, 1 engine each, 3 repeats
    .venv/bin/python bench/bench_lab_start.py --pcs 4 --engines 2 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_kit.room.build import emulated_room, room_unavailable_reason  # noqa: E402
from course_kit.room.ssh import write_ssh_standins  # noqa: E402
from course_lib.cluster import start_cluster  # noqa: E402


def lab(env: dict[str, str], action: str, hosts: Path) -> str:
    """Run ``./kit lab ACTION HOSTS`` (its Python half); return its output, raise on failure."""
    done = subprocess.run(
        [sys.executable, "-m", "course_kit.jobs.cluster", "lab", action, str(hosts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kit lab {action} failed: {done.stderr[-2000:]}")
    return done.stdout


def time_lab(n_pcs: int, engines: int, repeats: int) -> list[float]:
    """Return the seconds ``lab start`` reported until every engine answered, per repeat."""
    times = []
    with emulated_room(n_pcs) as room, tempfile.TemporaryDirectory() as tmp:
        ssh, scp = write_ssh_standins(room, Path(tmp) / "bin")
        hosts = Path(tmp) / "hosts.toml"
        pcs = "".join(f'[[pc]]\nhost = "{pc.hostname}"\nengines = {engines}\n' for pc in room.pcs)
        hosts.write_text(
            f'[controller]\nip = "{room.instructor_ip}"\n[defaults]\npython = "{sys.executable}"\n'
            f'[ssh]\ncommand = ["{ssh}"]\nscp = ["{scp}"]\n{pcs}'
        )
        env = dict(os.environ, IPYTHONDIR=str(Path(tmp) / "ipython"), OMP_NUM_THREADS="1")
        for _ in range(repeats):
            out = lab(env, "start", hosts)
            try:
                times.append(float(re.search(r"answered after ([\d.]+) s", out)[1]))
            finally:
                lab(env, "stop", hosts)
    return times


def time_local(n: int, repeats: int) -> list[float]:
    """Return the seconds a local ``start_cluster(n)`` took until its engines answered."""
    times = []
    for _ in range(repeats):
        start = time.monotonic()
        with start_cluster("local", n, timeout=300) as cluster:
            cluster.view.apply_sync(os.getpid)
            times.append(time.monotonic() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pcs", type=int, default=4)
    parser.add_argument("--engines", type=int, default=1, help="engines per PC")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reason = room_unavailable_reason()
    if reason is not None:
        print(f"bench_lab_start: skipped, no emulated room here: {reason}")
        return 0
    n = args.pcs * args.engines
    lab_times = time_lab(args.pcs, args.engines, args.repeats)
    lab_s = statistics.median(lab_times)
    print(
        f"lab start, {args.pcs} PCs x {args.engines} engines over the SSH launcher: median "
        f"{lab_s:.1f} s until every engine answers (runs: {', '.join(f'{t:.1f}' for t in lab_times)})",
        flush=True,
    )
    local_times = time_local(n, args.repeats)
    local_s = statistics.median(local_times)
    print(
        f"local start_cluster({n}) on this machine: median {local_s:.1f} s "
        f"(runs: {', '.join(f'{t:.1f}' for t in local_times)}); ratio lab/local {lab_s / local_s:.2f}"
    )
    print(f"target: every engine answering in 15 s; {os.cpu_count()} CPU cores here")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
