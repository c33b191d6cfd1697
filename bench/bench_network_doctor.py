"""Benchmark the network doctor in an emulated room: each measured link against its shaped rate.

Starts the instructor's cluster of ``tests/kit/room/test_room.py`` (3 PCs, 4 engines, every link shaped
to 1 Gbit/s with tc tbf), optionally reshapes the last PC to ``--slow`` (a PC left at 100
Mbit/s), runs :func:`measure_network` ``--rounds`` times and prints, per link, the median
measured bandwidth, the shaped rate and their ratio (the target: within 10 %, i.e. 0.90-1.05;
TCP's headers alone take ~4 %), and the rules' verdicts. Needs root, ``ip``, ``tc``, ``unshare``.

    .venv/bin/python bench/bench_network_doctor.py
    .venv/bin/python bench/bench_network_doctor.py --slow none --rounds 5 --mib 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_room import Lab  # noqa: E402 - the tested lab set-up, not a copy of it

from course_kit.network.doctor import CONTROLLER, measure_network  # noqa: E402
from course_kit.room.build import room_unavailable_reason, shape_pc  # noqa: E402

RATES = {"1gbit": 125e6, "100mbit": 12.5e6, "none": None}


def main() -> int:
    """Run the benchmark and print one line per link."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=8, help="message size in MiB")
    parser.add_argument(
        "--slow",
        choices=["100mbit", "none"],
        default="100mbit",
        help="reshape the last PC to this rate",
    )
    args = parser.parse_args()
    if (reason := room_unavailable_reason()) is not None:
        print(f"no emulated room here: {reason}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp))
        try:
            lab.start()
            rate_of = {pc.hostname: RATES["1gbit"] for pc in lab.room.pcs}
            rate_of[CONTROLLER] = RATES["1gbit"]
            if args.slow != "none":
                shape_pc(lab.room, lab.room.pcs[-1], args.slow)
                rate_of[lab.room.pcs[-1].hostname] = RATES[args.slow]
            reports, seconds = [], []
            for _ in range(args.rounds):
                t0 = time.monotonic()
                reports.append(measure_network(lab.cluster, nbytes=args.mib * 2**20))
                seconds.append(time.monotonic() - t0)
        finally:
            lab.close()
    print(reports[-1])
    print(
        f"\n{args.rounds} rounds, {args.mib} MiB messages, median {statistics.median(seconds):.1f}"
        " s per round"
    )
    print(f"{'link':<36} {'median MB/s':>11} {'shaped MB/s':>11} {'ratio':>6}")
    for i, link in enumerate(reports[0].links):
        rates = [r.links[i].bandwidth or 0.0 for r in reports]
        shaped = min(rate_of[link.src], rate_of[link.dst])
        median = statistics.median(rates)
        print(
            f"{link.src + ' -> ' + link.dst:<36} {median / 1e6:>11.1f} {shaped / 1e6:>11.1f} "
            f"{median / shaped:>6.3f}"
        )
    flagged = [sum("slow link" in p for p in r.problems) for r in reports]
    print(f"slow links flagged per round: {flagged}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
