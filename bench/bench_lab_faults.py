"""Benchmark a PC dropping out of the lab's cluster: seconds until ``./kit lab status`` names it.

Builds an emulated room of N PCs (see ``course_kit/room/build.py``), starts the lab's cluster
through the SSH launcher (``./kit lab start``, as ``bench_lab_start.py``), then, per repeat and
per fault, either kills one PC's engines (SIGKILL to every process in its namespace) or cuts its
link (``ip link set VETH down``), and times three things from the fault on:

- ``unregistered``: until a client (a student's notebook) no longer lists the PC's engine: the
  controller's heartbeat decides it, ``(HEARTBEAT_MISSES + 1) * HEARTBEAT_MS`` at most;
- ``named``: until ``lab_status`` (what ``./kit lab status`` prints) names the PC as dropped out;
  a status call waits for a silent engine until the heartbeat has decided (up to 17 s);
- ``re-added``: how long ``add_pcs`` (``./kit lab add HOSTS PC``) takes until its engines answer.

Meanwhile a computation on the remaining engines must succeed. Prints the medians and the bound.
Needs root, ``ip``, ``tc``, ``unshare``.

    .venv/bin/python bench/bench_lab_faults.py               # 4 PCs, 3 repeats of each fault
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_kit.lab.cluster import add_pcs, lab_status, start_lab, stop_lab  # noqa: E402
from course_kit.lab.hosts import read_hosts  # noqa: E402
from course_kit.lab.roster import HEARTBEAT_MISSES, HEARTBEAT_MS  # noqa: E402
from course_kit.room.build import emulated_room, room_unavailable_reason  # noqa: E402
from course_kit.room.ssh import write_ssh_standins  # noqa: E402


def _square(x: int) -> int:
    return x * x


def _kill(netns: str) -> None:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    for pid in (int(p) for p in done.stdout.split()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def measure(n_pcs: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Return seconds per fault kind ("kill", "link") and per step, over ``repeats``."""
    import ipyparallel as ipp

    results: dict[str, dict[str, list[float]]] = {
        kind: {"unregistered": [], "named": [], "re-added": []} for kind in ("kill", "link")
    }
    with emulated_room(n_pcs) as room, tempfile.TemporaryDirectory() as tmp:
        ssh, scp = write_ssh_standins(room, Path(tmp) / "bin")
        hosts_file = Path(tmp) / "hosts.toml"
        hosts_file.write_text(
            f'[controller]\nip = "{room.instructor_ip}"\n[defaults]\npython = "{sys.executable}"\n'
            f'[ssh]\ncommand = ["{ssh}"]\nscp = ["{scp}"]\n'
            + "".join(f'[[pc]]\nhost = "{pc.hostname}"\n' for pc in room.pcs)
        )
        os.environ.update(IPYTHONDIR=str(Path(tmp) / "ipython"), OMP_NUM_THREADS="1")
        hosts = read_hosts(hosts_file)
        cluster, seconds = start_lab(hosts, timeout=600)
        print(f"lab start: {n_pcs} engines answered after {seconds:.1f} s", flush=True)
        security = Path(os.environ["IPYTHONDIR"]) / "profile_lab" / "security"
        try:
            with ipp.Client(str(security / "ipcontroller-client.json")) as student:
                for i in range(repeats):
                    for kind in ("kill", "link"):
                        pc = room.pcs[1 + (i % (n_pcs - 1))]
                        before = len(student.ids)
                        t0 = time.monotonic()
                        if kind == "kill":
                            _kill(pc.netns)
                        else:
                            subprocess.run(["ip", "link", "set", pc.host_veth, "down"], check=True)
                        steps = results[kind]
                        unregistered = named = None
                        while unregistered is None or named is None:
                            if unregistered is None and len(student.ids) < before:
                                unregistered = time.monotonic() - t0
                            if named is None:
                                _, text = lab_status(hosts)
                                if f"dropped out: {pc.hostname}" in text:
                                    named = time.monotonic() - t0
                            if time.monotonic() - t0 > 600:
                                raise TimeoutError(f"{pc.hostname} not reported in 600 s")
                            time.sleep(0.2)
                        squares = student.load_balanced_view().map_sync(_square, range(8))
                        assert squares == [x * x for x in range(8)], squares
                        if kind == "link":
                            subprocess.run(["ip", "link", "set", pc.host_veth, "up"], check=True)
                        added, seconds = add_pcs(hosts, [pc.hostname], timeout=600)
                        assert added == [pc.hostname], added
                        steps["unregistered"].append(unregistered)
                        steps["named"].append(named)
                        steps["re-added"].append(seconds)
                        print(
                            f"  {kind} {pc.hostname}: unregistered {unregistered:.1f} s, named "
                            f"{named:.1f} s, re-added in {seconds:.1f} s",
                            flush=True,
                        )
        finally:
            stop_lab(hosts)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pcs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reason = room_unavailable_reason()
    if reason is not None:
        print(f"bench_lab_faults: skipped, no emulated room here: {reason}")
        return 0
    results = measure(args.pcs, args.repeats)
    bound = (HEARTBEAT_MISSES + 1) * HEARTBEAT_MS / 1000
    load = os.getloadavg()[0]
    print(
        f"{args.pcs} PCs, 1 engine each, {args.repeats} repeats per fault; machine load "
        f"{load:.1f} on {os.cpu_count()} cores{' (loaded)' if load > (os.cpu_count() or 1) else ''}"
    )
    print(
        f"heartbeat: a ping every {HEARTBEAT_MS} ms, unregistered after {HEARTBEAT_MISSES} "
        f"misses: bound {bound:g} s; status adds its own run"
    )
    for kind, steps in results.items():
        medians = ", ".join(
            f"{step} {statistics.median(v):.1f} s (max {max(v):.1f})" for step, v in steps.items()
        )
        print(f"  {'engines killed' if kind == 'kill' else 'link cut':14s}: {medians}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
