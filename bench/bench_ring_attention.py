"""Ring attention with and without overlap of transfer and compute, on an emulated link.

On 2 and 4 local gloo engines, each rank times ring attention's forward (zig-zag layout,
4 heads of 32) in interleaved rounds (``course_lib.timing``), with the next key / value block's
transfer posted before the block's compute (``overlapped``) and waited for first
(``transfer, then compute``), through an emulated Gigabit link and a 100 Mbit one
(``course_lib.comm.emulate``). It prints, per world size, link and length, the sentence
``course_lib.timing.compare`` writes from the two spreads (slowest rank's median), the bytes
per hop and the link's time for them, and the machine's load. Overlap can save at most the
smaller of a step's compute and transfer; on a loaded machine the compute is what varies.

    .venv/bin/python bench/bench_ring_attention.py            # 2 and 4 engines
    .venv/bin/python bench/bench_ring_attention.py --quick    # 2 engines, one length
"""

from __future__ import annotations

import argparse

from course_lib.cluster import start_cluster
from course_lib.comm import GIGABIT, EmulatedLink, setup_communicators
from course_lib.timing import compare, load_line

LINKS = {"Gigabit": GIGABIT, "100 Mbit": EmulatedLink(bandwidth=12.5e6)}


def _engine_times(length: int, rounds: int, link: EmulatedLink) -> dict[str, list[float]]:
    from IPython import get_ipython

    from course_lib.parallel.transformer.overlap import time_ring_overlap

    return time_ring_overlap(get_ipython().user_ns["comm"], length=length, rounds=rounds, link=link)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 engines, one length, 3 rounds")
    args = parser.parse_args()
    sizes, lengths, rounds = ((2,), (1024,), 3) if args.quick else ((2, 4), (512, 2048), 7)
    for n in sizes:
        with start_cluster(n=n, seed=0) as cluster:
            setup_communicators(cluster, backend="gloo", timeout=120)
            for name, link in LINKS.items():
                for length in lengths:
                    per_rank = cluster.run(_engine_times, length, rounds, link, timeout=600)
                    slowest = max(
                        per_rank, key=lambda t: sorted(t["overlapped"])[len(t["overlapped"]) // 2]
                    )
                    hop = 2 * 4 * (length // n) * 32 * 4  # k and v of one rank's tokens, float32
                    print(
                        f"{n} engines, {name}, T = {length}: block {hop / 1e3:.0f} kB, "
                        f"{1e3 * (link.latency + hop / link.bandwidth):.1f} ms a hop on the link"
                    )
                    print(
                        "   "
                        + compare(
                            "overlapped",
                            slowest["overlapped"],
                            "transfer, then compute",
                            slowest["transfer, then compute"],
                        ).sentence
                    )
    print(load_line())


if __name__ == "__main__":
    main()
