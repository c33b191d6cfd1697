"""Benchmark allreduce: the backend's own vs the from-scratch ones, on loopback and emulated Gigabit.

For 1, 8 and 32 MB of float32 on 2 and 4 ranks of each backend (mpi, gloo), prints the median time
of the built-in allreduce and of each from-scratch one, their ratio to the built-in and to the
bandwidth bound 2(N-1)/N * S / B. On the real (loopback) link B comes from a ping-pong fit; on
the emulated Gigabit link B = 125 MB/s. Times are the slowest rank's, medians over repeats.

    .venv/bin/python bench/bench_allreduce.py           # full (a few minutes)
    .venv/bin/python bench/bench_allreduce.py --quick   # under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib import collectives as C  # noqa: E402
from course_lib.comm import GIGABIT, emulate, free_port, make_communicator  # noqa: E402
from course_lib.cost_model.alpha_beta import (  # noqa: E402
    LinkModel,
    allreduce_bound,
    ping_pong,
    predict,
    time_allreduce,
)

ALGORITHMS = {
    "builtin": None,
    "ring_allreduce": C.ring_allreduce,
    "recursive_doubling_allreduce": C.recursive_doubling_allreduce,
    "star_allreduce": C.star_allreduce,
    "allreduce_naive": C.allreduce_naive,
}


def worker(backend: str, quick: bool, out: str) -> None:
    kw = {}
    if backend == "gloo":
        kw = dict(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            master_port=int(os.environ["MASTER_PORT"]),
        )
    comm = make_communicator(backend, timeout=120, **kw)
    p = comm.world_size
    real = ping_pong(comm, sizes=[2**k for k in range(3, 24, 4)], repeats=3).model
    sizes_mb = [1, 8] if quick else [1, 8, 32]
    rows = []
    for mb in sizes_mb:
        x = np.random.default_rng(0).standard_normal(mb * 2**18).astype(np.float32)
        for link_name, c, model in (
            ("loopback", comm, real),
            ("emulated", emulate(comm, GIGABIT), LinkModel.from_link(GIGABIT)),
        ):
            names = list(ALGORITHMS)
            if link_name == "emulated":
                names = ["builtin", "ring_allreduce"] + ([] if quick else ["star_allreduce"])
            reps = 2 if (quick or link_name == "emulated") else 5
            base = None
            for name in names:
                t = time_allreduce(c, ALGORITHMS[name], x, reps)
                base = t if name == "builtin" else base
                bound = allreduce_bound(x.nbytes, p, model.bandwidth)
                pred = predict(name, x.nbytes, p, model) if name != "builtin" else float("nan")
                rows.append(
                    dict(
                        backend=backend,
                        n=p,
                        mb=mb,
                        link=link_name,
                        algorithm=name,
                        ms=t * 1e3,
                        vs_builtin=t / base,
                        vs_bound=t / bound,
                        predicted_ms=pred * 1e3,
                        label=c.label,
                    )
                )
    if comm.rank == 0:
        rows.append(
            dict(
                calibration=True,
                backend=backend,
                n=p,
                alpha_us=real.alpha * 1e6,
                bandwidth_mb_s=real.bandwidth / 1e6,
            )
        )
        Path(out).write_text(json.dumps(rows))
    comm.barrier()
    if backend == "gloo":  # torch's teardown at exit sometimes aborts once rank 0 has gone
        sys.stdout.flush()
        os._exit(0)


def launch(backend: str, n: int, quick: bool) -> list[dict]:
    """Run the worker on ``n`` ranks; return rank 0's rows, or exit naming the rank that failed."""
    workdir = Path(tempfile.mkdtemp(prefix="bench_allreduce_"))
    try:
        for attempt in (1, 2):
            rows = _run_world(backend, n, quick, workdir, last=attempt == 2)
            if rows is not None:
                return rows
        raise AssertionError("unreachable")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_world(backend: str, n: int, quick: bool, workdir: Path, last: bool) -> list[dict] | None:
    """Start one world; return its rows, or None to retry on a new port (gloo, port taken)."""
    out = workdir / "rows.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--worker", backend, "--out", str(out)] + (
        ["--quick"] if quick else []
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if backend == "mpi":
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        worlds = [([mpiexec, "-n", str(n), *cmd], env)]
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
    deadline, timed_out = time.monotonic() + 900, False
    while any(proc.poll() is None for proc in procs):
        if any(proc.returncode not in (None, 0) for proc in procs):
            break  # the others would wait for the failed rank until their own timeouts
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(0.1)
    failed = [i for i, proc in enumerate(procs) if proc.returncode not in (None, 0)]
    codes = {i: proc.returncode for i, proc in enumerate(procs) if i in failed}
    killed = [i for i, proc in enumerate(procs) if proc.poll() is None]
    for i in killed:
        procs[i].kill()
    for proc in procs:
        proc.wait()
    if not failed and not killed and out.exists():
        return json.loads(out.read_text())
    texts = [log.read_text(errors="replace") for log in logs]
    who = "mpiexec" if backend == "mpi" else "rank"
    first = failed[0] if failed else 0
    if backend == "gloo" and not last and "address already in use" in texts[first].lower():
        print(f"# {backend} x{n}: port {port} was taken before rank 0 bound it; retrying")
        return None
    what = [f"{who} {i} exited with code {code}" for i, code in codes.items()]
    if killed:
        what += [f"killed {who}(s) {killed}" + (" after 900 s" if timed_out else ", which waited")]
    what += [] if failed or killed else ["no result file"]
    sys.exit(
        f"{backend} x{n} failed: {'; '.join(what)}. Output of {who} {first}:\n"
        f"{texts[first][-4000:]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 8 MB, fewer repeats")
    parser.add_argument("--backends", default="mpi,gloo")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.quick, args.out)
        return
    print(
        f"{'backend':7} {'N':>2} {'MB':>3} {'link':9} {'algorithm':29} {'median ms':>10} "
        f"{'predicted':>10} {'/builtin':>8} {'/bound':>7}"
    )
    for backend in args.backends.split(","):
        for n in (int(v) for v in args.ranks.split(",")):
            rows = launch(backend, n, args.quick)
            for row in rows:
                if row.get("calibration"):
                    print(
                        f"# {backend} x{n} loopback ping-pong: alpha {row['alpha_us']:.1f} us, "
                        f"bandwidth {row['bandwidth_mb_s']:.0f} MB/s"
                    )
                    continue
                print(
                    f"{row['backend']:7} {row['n']:>2} {row['mb']:>3} {row['link']:9} "
                    f"{row['algorithm']:29} {row['ms']:10.2f} {row['predicted_ms']:10.2f} "
                    f"{row['vs_builtin']:8.2f} {row['vs_bound']:7.2f}",
                    flush=True,
                )
    print(
        f"# emulated rows: {GIGABIT.label}; built-in on it = real run, then padded to the ring cost"
    )
    print(
        f"# {os.cpu_count()} CPU cores shared by all ranks (MPICH busy-polls): ranks > cores inflate times"
    )


if __name__ == "__main__":
    main()
