"""Benchmark ``./kit lab start``: seconds until every engine on every PC answers.

Builds an emulated room of N PCs (see ``course_kit/room/build.py``), writes a hosts file
whose ``ssh`` / ``scp`` are the room's stand-ins (``course_kit/room/ssh.py``), and times
``python -m course_kit.jobs.cluster lab start`` (controller here, engines through the lab's
launcher, ``course_kit/lab/launcher.py``: one SSH call per PC, the PCs at once) and its ``stop``,
interleaved with a local ``start_cluster`` of the same size on this machine (so load hits both
alike). Prints each one's median and range, the ratio lab/local with the sentence the spreads
support (``course_lib.timing``), and the machine's load. Needs root, ``ip``, ``tc``, ``unshare``.
``bench/bench_slurm_startup.py`` times the same engines started through Slurm.

    .venv/bin/python bench/bench_lab_start.py               # 4 PCs, 2 engines each, 3 rounds
    .venv/bin/python bench/bench_lab_start.py --pcs 4 --engines 1 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import re
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
from course_lib.timing import Spread, compare, load_line  # noqa: E402


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


def lab_round(env: dict[str, str], hosts: Path) -> tuple[float, float]:
    """Start the lab and stop it; return (seconds until every engine answered, seconds to stop)."""
    out = lab(env, "start", hosts)
    stop_started = time.monotonic()
    try:
        answered = float(re.search(r"answered after ([\d.]+) s", out)[1])
    finally:
        lab(env, "stop", hosts)
    return answered, time.monotonic() - stop_started


def local_round(n: int) -> float:
    """Return the seconds a local ``start_cluster(n)`` took until its engines answered."""
    start = time.monotonic()
    with start_cluster("local", n, timeout=300) as cluster:
        cluster.view.apply_sync(os.getpid)
        return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pcs", type=int, default=4)
    parser.add_argument("--engines", type=int, default=2, help="engines per PC")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reason = room_unavailable_reason()
    if reason is not None:
        print(f"bench_lab_start: skipped, no emulated room here: {reason}")
        return 0
    n = args.pcs * args.engines
    starts, stops, locals_ = [], [], []
    with emulated_room(args.pcs) as room, tempfile.TemporaryDirectory() as tmp:
        ssh, scp = write_ssh_standins(room, Path(tmp) / "bin")
        hosts = Path(tmp) / "hosts.toml"
        pcs = "".join(
            f'[[pc]]\nhost = "{pc.hostname}"\nengines = {args.engines}\n' for pc in room.pcs
        )
        hosts.write_text(
            f'[controller]\nip = "{room.instructor_ip}"\n[defaults]\npython = "{sys.executable}"\n'
            f'[ssh]\ncommand = ["{ssh}"]\nscp = ["{scp}"]\n{pcs}'
        )
        env = dict(os.environ, IPYTHONDIR=str(Path(tmp) / "ipython"), OMP_NUM_THREADS="1")
        for round_ in range(args.repeats):  # interleaved: lab, local, lab, local, ...
            started, stopped = lab_round(env, hosts)
            starts.append(started)
            stops.append(stopped)
            locals_.append(local_round(n))
            print(f"round {round_ + 1}: lab start {started:.1f} s, stop {stopped:.1f} s, "
                  f"local start {locals_[-1]:.1f} s", flush=True)  # fmt: skip
    lab_s, local_s = Spread.of(starts), Spread.of(locals_)
    unit = {"unit": "s", "scale": 1.0}
    print(
        f"lab start, {args.pcs} PCs x {args.engines} engines: {lab_s.describe(**unit)} until every engine answers"
    )
    print(f"lab stop: {Spread.of(stops).describe(**unit)}")
    print(f"local start_cluster({n}) here: {local_s.describe(**unit)}")
    print(f"ratio lab/local (medians): {lab_s.median / local_s.median:.2f} (aim: at most 1.5)")
    print(compare("local start", local_s, "lab start", lab_s, unit="s", scale=1.0).sentence)
    print(load_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
