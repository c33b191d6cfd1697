"""Benchmark allreduce across an emulated room of PCs: ring vs gloo's own vs the bandwidth bound.

Builds a room of N PCs (network namespaces on a bridge, every link shaped to 1 Gbit/s with tc
tbf; see ``course_lib/cluster/room.py``), starts one gloo rank per PC, and prints for 1, 8 and 32 MB of
float32 the median time (slowest rank) of gloo's built-in allreduce, of ``ring_allreduce`` and
of ``ring_allreduce_pipelined`` (chunks cut into 1 MiB segments, each forwarded as it lands),
with their ratio to the bound 2(N-1)/N * S / B. B is measured in the same run: one-way
ping-pong of the largest message between two PCs. Needs root, ``ip``, ``tc`` and ``unshare``.
The links have a rate but no added latency (netem may be missing from the kernel); a veth round
trip is ~20 us, so the small-message times printed are the ranks' own overheads on this machine.

    .venv/bin/python bench/bench_room.py                 # 3 and 4 PCs (about a minute each)
    .venv/bin/python bench/bench_room.py --pcs 3 --sizes 1,8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.collectives import ring_allreduce  # noqa: E402
from course_lib.collectives.ring_pipelined import ring_allreduce_pipelined  # noqa: E402
from course_lib.comm import make_communicator  # noqa: E402
from course_lib.cost_model import allreduce_bound, ping_pong, time_allreduce  # noqa: E402

# Rank 0's namespace is private to this run, so a fixed port there cannot be taken by others.
PORT = 29500
PING_SIZES = [2**k for k in range(10, 24, 2)] + [2**23]  # 1 KB .. 8 MB


def worker(rank: int, world_size: int, addr: str, sizes_mb: list[int], reps: int, out: str):
    """Run on one PC: calibrate the link, time both allreduces, rank 0 writes the results."""
    comm = make_communicator("gloo", rank, world_size, addr, PORT, timeout=120, ifname="eth0")
    cal = ping_pong(comm, sizes=PING_SIZES, repeats=5, pair=(0, 1))
    bandwidth = PING_SIZES[-1] / cal.times[-1]  # bytes/s of the largest message, one way
    rows = []
    for mb in sizes_mb:
        x = np.random.default_rng(rank).standard_normal(mb * 2**18).astype(np.float32)
        builtin = time_allreduce(comm, None, x, reps)
        ring = time_allreduce(comm, ring_allreduce, x, reps)
        piped = time_allreduce(comm, ring_allreduce_pipelined, x, reps)
        bound = allreduce_bound(x.nbytes, world_size, bandwidth)
        rows.append({"mb": mb, "builtin": builtin, "ring": ring, "piped": piped, "bound": bound})
    if rank == 0:
        result = {"bandwidth": bandwidth, "fit_bandwidth": cal.model.bandwidth,
                  "alpha": cal.model.alpha, "ping": dict(zip(PING_SIZES, cal.times, strict=True)),
                  "rows": rows}  # fmt: skip
        Path(out).write_text(json.dumps(result))
    comm.barrier()
    sys.stdout.flush()
    os._exit(0)  # torch's teardown at exit sometimes aborts once rank 0 has gone


def run_room(n_pcs: int, rate: str, sizes_mb: list[int], reps: int) -> dict:
    """Build a room of ``n_pcs`` PCs, run one worker per PC, return rank 0's results."""
    from course_lib.cluster.room import emulated_room

    workdir = Path(tempfile.mkdtemp(prefix="bench_room_"))
    out = workdir / "result.json"
    with emulated_room(n_pcs, rate=rate) as room:
        addr = room.pcs[0].ip
        procs = []
        for rank, pc in enumerate(room.pcs):
            log = open(workdir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
            argv = [sys.executable, __file__, "--worker", str(rank), "--world", str(n_pcs),
                    "--addr", addr, "--sizes", ",".join(map(str, sizes_mb)),
                    "--repeats", str(reps), "--out", str(out)]  # fmt: skip
            procs.append((room.popen(pc, argv, stdout=log, stderr=subprocess.STDOUT), log))
        failed = []
        for rank, (proc, log) in enumerate(procs):
            try:
                code = proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                code = "timeout"
            log.close()
            if code != 0:
                failed.append(rank)
        if failed:
            logs = "\n".join((workdir / f"rank{r}.log").read_text()[-1500:] for r in failed)
            raise SystemExit(f"ranks {failed} failed on {n_pcs} PCs:\n{logs}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pcs", default="3,4", help="room sizes, e.g. 3,4")
    parser.add_argument("--sizes", default="1,8,32", help="buffer sizes in MB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate", default="1gbit", help="tbf rate of every link")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--addr", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes_mb = [int(s) for s in args.sizes.split(",")]
    if args.worker is not None:
        worker(args.worker, args.world, args.addr, sizes_mb, args.repeats, args.out)
        return
    from course_lib.cluster.room import room_unavailable_reason

    reason = room_unavailable_reason()
    if reason:
        raise SystemExit(f"cannot build an emulated room here: {reason}")
    load = os.getloadavg()[0]
    print(f"# emulated room, every link tbf {args.rate}; medians of {args.repeats}, slowest rank; "
          f"load average {load:.1f}{' (loaded)' if load > 2 else ''}")  # fmt: skip
    print(f"{'PCs':>3} {'MB':>3} {'algorithm':15} {'median ms':>10} {'/builtin':>9} {'/bound':>7}")
    for n in (int(p) for p in args.pcs.split(",")):
        started = time.perf_counter()
        res = run_room(n, args.rate, sizes_mb, args.repeats)
        ping = ", ".join(f"{int(s) // 1024} KB {t * 1e3:.2f} ms" for s, t in res["ping"].items())
        print(f"# {n} PCs: ping-pong PC1<->PC2, one way: {ping}")
        print(f"# {n} PCs: B = {res['bandwidth'] / 1e6:.1f} MB/s (8 MB one way); alpha-beta fit "
              f"{res['fit_bandwidth'] / 1e6:.1f} MB/s, alpha {res['alpha'] * 1e6:.0f} us")  # fmt: skip
        for row in res["rows"]:
            for name in ("builtin", "ring", "piped", "bound"):
                label = {"builtin": "gloo built-in", "ring": "ring_allreduce",
                         "piped": "ring pipelined"}.get(name, "bound")  # fmt: skip
                t = row[name]
                print(f"{n:>3} {row['mb']:>3} {label:15} {t * 1e3:>10.1f} "
                      f"{t / row['builtin']:>8.2f}x {t / row['bound']:>6.2f}x")  # fmt: skip
        print(f"# {n} PCs: {time.perf_counter() - started:.0f} s including set-up")


if __name__ == "__main__":
    main()
