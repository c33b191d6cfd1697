"""Benchmark MPI across the emulated room's PCs: MPI's Allreduce and the ring against the bound.

Builds a room of N PCs (1 Gbit/s ``tc tbf`` links, see ``course_kit/room/build.py``), writes a
hosts file whose ``ssh`` is the room's stand-in, and runs
``course_lib.collectives.mpi_across_pcs`` as one MPI rank per PC through ``./kit lab mpi``
(MPICH's hydra over the stand-in; the kit sets ``UCX_TLS=tcp`` so no byte takes shared memory
between the namespaces). Prints the medians of MPI's own Allreduce and of the from-scratch ring
over the MPI communicator, and their ratio to the bound a ring allreduce cannot beat,
``2 (N-1)/N * S / B``, for B the link's rate (125 MB/s) and for the TCP payload it carries
(~119 MB/s: 1448 of every 1514 bytes on the wire). Needs root, ``ip``, ``tc``, ``unshare``.

    .venv/bin/python bench/bench_lab_mpi.py                   # 4 PCs, 32 MiB, 5 repeats
    .venv/bin/python bench/bench_lab_mpi.py --pcs 4 --mib 32 --repeats 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_kit.lab.hosts import read_hosts  # noqa: E402
from course_kit.lab.mpi import run_lab_mpi  # noqa: E402
from course_kit.room.build import emulated_room, room_unavailable_reason  # noqa: E402
from course_kit.room.ssh import write_ssh_standins  # noqa: E402

LINK_BYTES = 125e6  # 1 Gbit/s
PAYLOAD_BYTES = LINK_BYTES * 1448 / 1514  # TCP payload of full-size frames on that link


def run(n_pcs: int, mib: float, repeats: int) -> dict:
    """Run the rank program in a fresh room; return rank 0's report."""
    with emulated_room(n_pcs) as room, tempfile.TemporaryDirectory() as tmp:
        ssh, _ = write_ssh_standins(room, Path(tmp) / "bin")
        hosts_file = Path(tmp) / "hosts.toml"
        hosts_file.write_text(
            f'[defaults]\npython = "{sys.executable}"\n[ssh]\ncommand = ["{ssh}"]\n'
            + "".join(f'[[pc]]\nhost = "{pc.hostname}"\n' for pc in room.pcs)
        )
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        argv = [
            sys.executable,
            "-m",
            "course_lib.collectives.mpi_across_pcs",
            "--mib",
            str(mib),
            "--repeats",
            str(repeats),
        ]
        done = run_lab_mpi(read_hosts(hosts_file), Path(tmp), argv, timeout=900, capture=True)
    if done.returncode != 0:
        raise RuntimeError(f"kit lab mpi failed: {done.stderr[-3000:]}")
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("ALLREDUCE "))
    return json.loads(line.removeprefix("ALLREDUCE "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pcs", type=int, default=4)
    parser.add_argument("--mib", type=float, default=32.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    reason = room_unavailable_reason()
    if reason is not None:
        print(f"bench_lab_mpi: skipped, no emulated room here: {reason}")
        return 0
    report = run(args.pcs, args.mib, args.repeats)
    n, size = report["ranks"], report["bytes"]
    load = os.getloadavg()[0]
    print(
        f"MPI across {n} PCs of the emulated room (1 Gbit/s links), {size / 2**20:g} MiB "
        f"float32, {args.repeats} repeats; machine load {load:.1f} on {os.cpu_count()} cores"
        f"{' (loaded)' if load > (os.cpu_count() or 1) else ''}"
    )
    print(
        f"  exact on every rank: {report['max_error'] == 0.0} (largest error "
        f"{report['max_error']:g}); one rank per PC: {sorted(report['hosts'])}"
    )
    bound = 2 * (n - 1) / n * size / LINK_BYTES
    payload_bound = 2 * (n - 1) / n * size / PAYLOAD_BYTES
    print(
        f"  bound 2(N-1)/N*S/B: {bound:.3f} s at 125 MB/s, {payload_bound:.3f} s at the "
        f"~{PAYLOAD_BYTES / 1e6:.0f} MB/s of TCP payload"
    )
    for name in ("mpi", "ring"):
        times = report[f"{name}_seconds"]
        median = statistics.median(times)
        print(
            f"  {'MPI Allreduce' if name == 'mpi' else 'ring (MPI comm)':16s} median "
            f"{median:.3f} s = {median / bound:.2f} x bound ({median / payload_bound:.2f} x "
            f"payload bound); runs {', '.join(f'{t:.3f}' for t in times)}"
        )
    print("  goal: within 10 % of the bound (1.10 x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
