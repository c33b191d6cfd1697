"""Benchmark all-to-all: the backend's own against pairwise exchange and the naive one (lecture 15).

For blocks of 1 KiB, 64 KiB and 1 MiB per pair of ranks on 2 and 4 ranks of each backend (gloo's
``all_to_all_single``, MPI's ``Alltoallv``), times the three in interleaved rounds; a round's
time is the slowest rank's. Prints each one's median, its ratio to the built-in, the sentence
``course_lib.timing.compare`` writes for pairwise vs built-in (a ratio only when the ranges are
apart) and the bytes each rank sent against (N-1)/N of its buffer.

    .venv/bin/python bench/bench_all_to_all.py           # full (a few minutes)
    .venv/bin/python bench/bench_all_to_all.py --quick   # gloo only, fewer rounds
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

from course_lib import collectives as C  # noqa: E402
from course_lib import timing  # noqa: E402
from course_lib.comm import free_port, make_communicator  # noqa: E402

BLOCKS_KIB = (1, 64, 1024)


def worker(backend: str, rounds: int, out: str) -> None:
    kw = {}
    if backend == "gloo":
        kw = dict(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            master_port=int(os.environ["MASTER_PORT"]),
        )
    comm = make_communicator(backend, timeout=120, **kw)
    p, rows = comm.world_size, []
    for kib in BLOCKS_KIB:
        x = np.random.default_rng(comm.rank).standard_normal(p * kib * 256).astype(np.float32)
        candidates = {
            "builtin": lambda x=x: comm.all_to_all(x),
            "pairwise": lambda x=x: C.pairwise_all_to_all(comm, x),
            "naive": lambda x=x: C.all_to_all_naive(comm, x),
        }
        comm.stats.reset()
        spreads = timing.interleaved_rounds(candidates, rounds=rounds)
        sent = {  # bytes per call, from the counters (built-in: its all_to_all counter)
            "builtin": comm.stats.collectives["all_to_all"].bytes / (rounds + 1),
            "pairwise+naive": comm.stats.bytes_sent / (rounds + 1),
        }
        slowest = {}
        for name, spread in spreads.items():  # a round lasts as long as its slowest rank
            times = np.array(spread.samples)
            comm.allreduce(times, op="max")
            slowest[name] = times.tolist()
        rows.append(dict(backend=backend, n=p, kib=kib, times=slowest, sent=sent, nbytes=x.nbytes))
    if comm.rank == 0:
        Path(out).write_text(json.dumps(rows))
    comm.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown at exit sometimes aborts once rank 0 has gone


def launch(backend: str, n: int, rounds: int) -> list[dict]:
    """Run the worker on ``n`` ranks; return rank 0's rows, or exit with the failed rank's output."""
    workdir = Path(tempfile.mkdtemp(prefix="bench_all_to_all_"))
    out = workdir / "rows.json"
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        backend,
        "--rounds",
        str(rounds),
        "--out",
        str(out),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if backend == "mpi":
        worlds = [([str(Path(sys.executable).parent / "mpiexec"), "-n", str(n), *cmd], env)]
    else:
        port = free_port("127.0.0.1")
        worlds = [
            (cmd, dict(env, RANK=str(r), WORLD_SIZE=str(n), MASTER_PORT=str(port)))
            for r in range(n)
        ]
    logs = [workdir / f"rank{i}.log" for i in range(len(worlds))]
    procs = []
    for (args, proc_env), log in zip(worlds, logs, strict=True):
        with open(log, "w") as sink:  # a file, not a pipe: nobody reads a pipe while we wait
            procs.append(
                subprocess.Popen(args, env=proc_env, stdout=sink, stderr=subprocess.STDOUT)
            )
    deadline = time.monotonic() + 600
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        if any(proc.returncode not in (None, 0) for proc in procs):
            break
        time.sleep(0.1)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if out.exists():
        return json.loads(out.read_text())
    sys.exit(
        f"{backend} x{n} failed; its first log:\n{logs[0].read_text(errors='replace')[-3000:]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="gloo only, 3 rounds")
    parser.add_argument("--backends", default="gloo,mpi")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.rounds, args.out)
        return
    backends = ["gloo"] if args.quick else args.backends.split(",")
    rounds = 3 if args.quick else args.rounds
    if "mpi" in backends and not (Path(sys.executable).parent / "mpiexec").exists():
        print("# no mpiexec beside this Python: gloo only")
        backends = [b for b in backends if b != "mpi"]
    print(
        f"{'backend':7} {'N':>2} {'block':>8} {'builtin ms':>10} {'pairwise':>9} {'naive':>9}  bytes sent (formula)"
    )
    for backend in backends:
        for n in (int(v) for v in args.ranks.split(",")):
            for row in launch(backend, n, rounds):
                med = {k: float(np.median(v)) * 1e3 for k, v in row["times"].items()}
                formula = (n - 1) / n * row["nbytes"]
                sent = row["sent"]
                print(
                    f"{backend:7} {n:>2} {row['kib']:>5} KiB {med['builtin']:10.3f} "
                    f"{med['pairwise'] / med['builtin']:8.2f}x {med['naive'] / med['builtin']:8.2f}x  "
                    f"{sent['builtin']:.0f} / {sent['pairwise+naive'] / 2:.0f} ({formula:.0f})"
                )
                verdict = timing.compare(
                    "built-in", row["times"]["builtin"], "pairwise", row["times"]["pairwise"]
                )
                print(f"#   {verdict.sentence}", flush=True)
    print(f"# ratios: median time / built-in's; {timing.load_line()}")


if __name__ == "__main__":
    main()
