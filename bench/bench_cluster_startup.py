"""Benchmark: how long until N local engines are ready, and a trivial %px-style round trip.

Run: ``.venv/bin/python bench/bench_cluster_startup.py [--repeats 3] [--engines 2 4]``.
Prints medians (and min / max) over the repeats; every figure is measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from course_lib.cluster import start_cluster
from course_lib.demo import round_trip_seconds


def time_to_ready(n: int) -> tuple[float, float]:
    """Start ``n`` local engines; return seconds until they are usable and the round trip."""
    started = time.perf_counter()
    with start_cluster("local", n) as cluster:
        ready = time.perf_counter() - started
        trip = round_trip_seconds(cluster, repeats=50)
    return ready, trip


def main() -> None:
    """Print the start-up and round-trip table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    print(f"{'engines':>8} {'ready median s':>15} {'min':>6} {'max':>6} {'round trip ms':>14}")
    for n in args.engines:
        runs = [time_to_ready(n) for _ in range(args.repeats)]
        ready = [r for r, _ in runs]
        trip = statistics.median(t for _, t in runs)
        print(
            f"{n:>8} {statistics.median(ready):>15.2f} {min(ready):>6.2f} {max(ready):>6.2f}"
            f" {1e3 * trip:>14.2f}"
        )
    print("goal: 4 engines ready in at most 10 s")


if __name__ == "__main__":
    main()
