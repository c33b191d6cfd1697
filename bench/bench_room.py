"""Benchmark allreduce across an emulated room of PCs: ring vs gloo's own vs the bandwidth bound.

Builds a room of N PCs (network namespaces on a bridge, every link shaped to 1 Gbit/s with tc
tbf; see ``course_kit/room/build.py``), starts one gloo rank per PC, and prints for 1, 8 and 32
MB of float32 the median time (slowest rank) of gloo's built-in allreduce, of ``ring_allreduce``
and of ``ring_allreduce_pipelined`` (chunks cut into segments, each forwarded as it lands), with
their ratio to the bound 2(N-1)/N * S / B and the percentage of the bound they reach.

B is measured in the same run by a ping-pong between two PCs, two ways. ``B stream`` is the slope
between the 4 MB and 8 MB one-way times (the fastest of 7 each): the rate a long transfer sees, what each link of a ring
carries for the whole allreduce. ``B ping`` (8 MB / its one-way time, the figure this benchmark
used first) is higher because each ping-pong starts on an idle link whose tbf bucket lets its
first 256 KB through at memory speed; over the 2(N-1) back-to-back chunks of an allreduce that
bonus counts once, not once per chunk, so a bound from ``B ping`` is out of any ring's reach by
about 1.5 % at 32 MB. The tbf rate itself, less the TCP/IP/Ethernet headers of a 1448-byte
segment (66 bytes), is printed as the ``wire`` prediction; ``B stream`` should match it.

For the pipelined ring one run is traced on every rank (its ``timeline`` argument) and the
slowest rank's time is split into start-up (entry to the first segment's arrival; the size check
with the neighbours is part of it), the 2(N-1) steps (each against the time its chunk needs on
the link at ``B stream``) and the tail after the last arrival.
Needs root, ``ip``, ``tc`` and ``unshare``.

    .venv/bin/python bench/bench_room.py                 # 3 and 4 PCs (about a minute each)
    .venv/bin/python bench/bench_room.py --pcs 4 --sizes 32 --repeats 9 --segments 1,4
"""

from __future__ import annotations

import argparse
import functools
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
from course_lib.comm.buffers import chunk_bounds  # noqa: E402
from course_lib.cost_model.alpha_beta import allreduce_bound, allreduce_times, ping_pong  # noqa: E402

# Rank 0's namespace is private to this run, so a fixed port there cannot be taken by others.
PORT = 29500
PING_SIZES = [2**k for k in range(10, 24, 2)] + [2**23]  # 1 KB .. 8 MB
WIRE_PAYLOAD = 1448 / 1514  # TCP payload per Ethernet frame (MSS 1448 with timestamps)


def algorithms(segments_mib: list[float]) -> dict:
    """Return name -> allreduce (None: the backend's own) in the order they are timed."""
    algos: dict = {"builtin": None, "ring": ring_allreduce}
    for mib in segments_mib:
        algos[f"piped {mib:g}M"] = functools.partial(
            ring_allreduce_pipelined, segment_bytes=int(mib * 2**20)
        )
    return algos


def traced_steps(comm, x: np.ndarray, segment_bytes: int) -> list[float]:
    """Run one pipelined allreduce; return this rank's event times relative to its entry (s).

    Layout: [size check done, last arrival of each of the 2(N-1) steps..., return], all from
    the entry; the first segment's arrival is put in front.
    """
    timeline: list = []
    buf = x.copy()
    comm.barrier()
    ring_allreduce_pipelined(comm, buf, segment_bytes=segment_bytes, timeline=timeline)
    t0 = timeline[0][2]
    steps = 2 * (comm.world_size - 1)
    checked = next(t for k, _, t in timeline if k == -2) - t0
    first = next(t for k, _, t in timeline if k == 0) - t0
    last = [max(t for k, _, t in timeline if k == s) - t0 for s in range(steps)]
    return [first, checked, *last, timeline[-1][2] - t0]


def worker(
    rank: int,
    world_size: int,
    addr: str,
    sizes_mb: list[float],
    reps: int,
    segments_mib: list[float],
    out: str,
) -> None:
    """Run on one PC: calibrate the link, time the allreduces, rank 0 writes the results."""
    comm = make_communicator("gloo", rank, world_size, addr, PORT, timeout=120, ifname="eth0")
    cal = ping_pong(comm, sizes=PING_SIZES, repeats=7, pair=(0, 1))
    b_ping = PING_SIZES[-1] / cal.times[-1]  # bytes/s of the largest message, one way (median)
    # the fastest of the repeats: a bound wants the best the link does, and load only slows it
    fastest = {size: min(times) for size, times in cal.samples.items() if times}
    b_stream = float("nan")  # only the timed pair has samples; rank 0 (in it) reports
    if PING_SIZES[-1] in fastest and PING_SIZES[-2] in fastest:
        b_stream = (PING_SIZES[-1] - PING_SIZES[-2]) / (
            fastest[PING_SIZES[-1]] - fastest[PING_SIZES[-2]]
        )
    algos = algorithms(segments_mib)
    rows = []
    for mb in sizes_mb:
        x = np.random.default_rng(rank).standard_normal(int(mb * 2**18)).astype(np.float32)
        samples: dict[str, list[float]] = {name: [] for name in algos}
        for fn in algos.values():  # warm-up: buffers, connections, caches
            allreduce_times(comm, fn, x, 1, warmup=0)
        for _ in range(reps):  # interleaved, so a change in machine load hits every algorithm
            for name, fn in algos.items():
                samples[name] += allreduce_times(comm, fn, x, 1, warmup=0).tolist()
        trace = np.array(traced_steps(comm, x, int(segments_mib[0] * 2**20)))
        traces = comm.allgather(trace)
        slowest = traces[int(np.argmax(traces[:, -1]))]
        (a, b) = chunk_bounds(x.size, world_size)[0]
        rows.append(
            {
                "mb": mb,
                "nbytes": x.nbytes,
                "chunk_bytes": (b - a) * x.itemsize,
                "median": {n: float(np.median(s)) for n, s in samples.items()},
                "samples": samples,
                "trace": slowest.tolist(),
            }
        )
    if rank == 0:
        result = {
            "b_ping": b_ping,
            "b_stream": b_stream,
            "fit_bandwidth": cal.model.bandwidth,
            "alpha": cal.model.alpha,
            "ping": dict(zip(PING_SIZES, cal.times, strict=True)),
            "rows": rows,
        }
        tmp = Path(out).with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(out)
    comm.barrier()
    sys.stdout.flush()
    os._exit(0)  # torch's teardown at exit sometimes aborts once rank 0 has gone


def run_room(n_pcs: int, rate: str, sizes_mb: list[float], reps: int, segments: str) -> dict:
    """Build a room of ``n_pcs`` PCs, run one worker per PC, return rank 0's results."""
    from course_kit.room.build import emulated_room

    workdir = Path(tempfile.mkdtemp(prefix="bench_room_"))
    out = workdir / "result.json"
    with emulated_room(n_pcs, rate=rate) as room:
        addr = room.pcs[0].ip
        procs = []
        for rank, pc in enumerate(room.pcs):
            log = open(workdir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
            argv = [
                sys.executable,
                __file__,
                "--worker",
                str(rank),
                "--world",
                str(n_pcs),
                "--addr",
                addr,
                "--sizes",
                ",".join(map(str, sizes_mb)),
                "--repeats",
                str(reps),
                "--segments",
                segments,
                "--out",
                str(out),
            ]
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


def rate_bytes(rate: str) -> float:
    """Return tbf's ``rate`` (``"1gbit"``, ``"100mbit"``) in bytes per second."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * scale / 8
    raise ValueError(f"rate {rate!r}: give it as tbf does, e.g. 1gbit or 100mbit")


def print_room(n: int, res: dict, rate: str) -> None:
    """Print one room's calibration, the table of times and the pipelined ring's breakdown."""
    ping = ", ".join(f"{int(s) // 1024} KB {t * 1e3:.2f} ms" for s, t in res["ping"].items())
    wire = rate_bytes(rate) * WIRE_PAYLOAD
    print(f"# {n} PCs: ping-pong PC1<->PC2, one way: {ping}")
    print(
        f"# {n} PCs: B stream = {res['b_stream'] / 1e6:.1f} MB/s (4 -> 8 MB slope); B ping = "
        f"{res['b_ping'] / 1e6:.1f} MB/s (8 MB one way); wire {wire / 1e6:.1f} MB/s (predicted: "
        f"{rate} less headers); alpha-beta fit {res['fit_bandwidth'] / 1e6:.1f} MB/s, alpha "
        f"{res['alpha'] * 1e6:.0f} us"
    )
    for row in res["rows"]:
        bound = allreduce_bound(row["nbytes"], n, res["b_stream"])
        bound_ping = allreduce_bound(row["nbytes"], n, res["b_ping"])
        builtin = row["median"]["builtin"]
        for name, t in [*row["median"].items(), ("bound", bound)]:
            label = {"builtin": "gloo built-in", "ring": "ring_allreduce"}.get(name, name)
            label = label.replace("piped", "ring pipelined")
            print(
                f"{n:>3} {row['mb']:>3g} {label:20} {t * 1e3:>9.1f} {t / builtin:>8.2f}x "
                f"{t / bound:>6.2f}x {100 * bound / t:>6.1f} % {100 * bound_ping / t:>6.1f} %"
            )
        first, checked, *steps, end = row["trace"]
        link_step = row["chunk_bytes"] / res["b_stream"]
        durations = np.diff([checked, *steps])  # step k: from step k-1's last arrival
        busy = len(steps) * link_step / end
        print(
            f"# {n} PCs {row['mb']} MB, ring pipelined, slowest rank of one traced run: "
            f"{end * 1e3:.1f} ms = size check {checked * 1e3:.1f} ms, then steps "
            f"{' '.join(f'{d * 1e3:.1f}' for d in durations)} ms (link: {link_step * 1e3:.1f} "
            f"ms per chunk), tail {(end - steps[-1]) * 1e3:.1f} ms; first segment landed at "
            f"{first * 1e3:.1f} ms; link busy {100 * busy:.0f} %"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pcs", default="3,4", help="room sizes, e.g. 3,4")
    parser.add_argument(
        "--sizes", default="1,8,32", help="buffer sizes in MiB (4.3: the MLP's gradients)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--segments", default="1", help="pipelined ring segment sizes, MiB")
    parser.add_argument("--rate", default="1gbit", help="tbf rate of every link")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--addr", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes_mb = [float(s) for s in args.sizes.split(",")]
    segments_mib = [float(s) for s in args.segments.split(",")]
    if args.worker is not None:
        worker(args.worker, args.world, args.addr, sizes_mb, args.repeats, segments_mib, args.out)
        return
    rate_bytes(args.rate)  # a bad rate fails here, not inside the room
    from course_kit.room.build import room_unavailable_reason

    reason = room_unavailable_reason()
    if reason:
        raise SystemExit(f"cannot build an emulated room here: {reason}")
    for n in (int(p) for p in args.pcs.split(",")):
        load = os.getloadavg()[0]
        print(
            f"# emulated room, every link tbf {args.rate}; medians of {args.repeats} "
            f"(interleaved), slowest rank; load average {load:.1f}"
            f"{' (loaded: 2 cores)' if load > 2 else ''}"
        )
        print(
            f"{'PCs':>3} {'MB':>3} {'algorithm':20} {'median ms':>9} {'/builtin':>9} "
            f"{'/bound':>7} {'of bound':>8} {'(B ping)':>8}"
        )
        started = time.perf_counter()
        res = run_room(n, args.rate, sizes_mb, args.repeats, args.segments)
        print_room(n, res, args.rate)
        print(
            f"# {n} PCs: {time.perf_counter() - started:.0f} s including set-up; load average "
            f"now {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
