"""Benchmark the synchronisation schemes: source 001's ten configurations, and a straggler.

Part 1 re-runs source 001's ten configurations (Local-SGD 1 / 4 / 16 / 32 x allreduce / gossip
/ gossip + sparsification) on 4 local engines over gloo and the emulated Gigabit link (125 MB/s,
50 us), with a documented stand-in for the source's CIFAR-10 CNN that runs offline: the digits
MLP (64 -> 128 -> 10, 9 610 weights), the same number of epochs for every configuration. Per
configuration it prints the test accuracy (mean over the replicas, which differ under Local-SGD
and gossip), the whole run's time, communication (``comm`` + ``sync`` phases), synchronisation
(communication + waiting, as the source defines it), and values sent per rank (float32 values;
sparse gossip's indices are counted in bytes), with the reduction against configuration 1.

Part 2: median step of each scheme on 4 engines with and without one emulated straggler (rank 1
at half speed; a sleep after its backward), loopback link.

All engines share this PC's cores: times are this machine's, emulated-link figures are labelled.

    .venv/bin/python bench/bench_sync_schemes.py            # a few minutes
    .venv/bin/python bench/bench_sync_schemes.py --quick    # 1 epoch (configuration 10 never syncs)
    .venv/bin/python bench/bench_sync_schemes.py --stragglers-only
    .venv/bin/python bench/bench_sync_schemes.py --room     # the ten in an emulated room (root)
    .venv/bin/python bench/bench_sync_schemes.py --seeds 3 --store bench/stored/source001_seeds.json
        # the ten over seeds 0, 1, 2 (no stragglers), each claim of the paper judged from the
        # seeds' 95 % interval; lecture 8 reads the stored file (about 6 min on 2 busy cores)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.cluster import start_cluster  # noqa: E402
from course_lib.comm import GIGABIT, EmulatedLink  # noqa: E402
from course_lib.data.digits import load_digits  # noqa: E402
from course_lib.papers.seeds import record  # noqa: E402
from course_lib.papers.source001_configurations import (  # noqa: E402
    CONFIGURATIONS,
    Configuration,
    compare_seeds_with_paper,
    compare_with_paper,
    configurations_table,
    run_configuration,
    seeds_table,
)
from course_lib.parallel.data_parallel.stragglers import Straggler  # noqa: E402
from course_lib.parallel.data_parallel.train import train_data_parallel  # noqa: E402
from course_lib.training.loop import TrainConfig  # noqa: E402
from course_lib.training.models import MLP  # noqa: E402


def options(period: int, averaging: str) -> dict:
    """Return ``train_data_parallel`` keywords for Local-SGD(period) with ``averaging``."""
    return Configuration(0, period, averaging).options()


def ten_configurations(
    cluster, epochs: int, link=GIGABIT, where: str = "", seeds: int = 1, store: str | None = None
) -> None:
    """Part 1: the table of source 001's ten configurations per seed (``link=None``: the real one).

    With ``seeds`` > 1 it also prints each configuration over the seeds and every claim of the
    paper judged from the seeds' spread; ``store`` writes the rows (one list per seed) as JSON.
    """
    test = load_digits(train=False)  # a data set (shipped to the engines), not a function
    where = where or (link.label if link is not None else "the real network")
    runs, loads = [], [os.getloadavg()[0]]
    for seed in range(seeds):
        config = TrainConfig(num_epochs=epochs, batch_size=64, lr=0.1, seed=seed)
        rows = [
            run_configuration(cluster, k, config=config, test_set=test, link=link)
            for k in CONFIGURATIONS
        ]
        runs.append(rows)
        loads.append(os.getloadavg()[0])
        print(
            f"\nsource 001's ten configurations: digits MLP, 4 engines, {epochs} epochs, seed "
            f"{seed}, {where} (gloo); load average {loads[-1]:.1f}"
        )
        print(
            "values sent per rank: gossip counts its messages; allreduce the ring's 2(N-1)/N per "
            "value handed to the backend; sparse gossip the values to each partner (indices: "
            "another 4 bytes each)"
        )
        print(configurations_table(rows))
        print(compare_with_paper(rows))
    if seeds > 1:
        print(f"\n# over {seeds} seeds (seed 0..{seeds - 1}), {where}")
        print(seeds_table(runs))
        print(compare_seeds_with_paper(runs))
    if store:
        record(
            store,
            runs,
            what=f"source 001's ten configurations, digits MLP, 4 engines, {epochs} epochs, "
            f"batch 64, lr 0.1, seeds 0..{seeds - 1}, {where}",
            when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            machine=f"{platform.node()}: {os.cpu_count()} cores, shared with other jobs",
            load=[round(x, 1) for x in loads],
            command="bench/bench_sync_schemes.py " + " ".join(sys.argv[1:]),
        )
        print(f"stored: {store}")


def stragglers(cluster, steps_config: TrainConfig) -> None:
    """Part 2: median step per scheme, with and without rank 1 at half speed."""
    schemes = {
        "BSP (local_sgd p=1)": options(1, "allreduce"),
        "Local-SGD(4)": options(4, "allreduce"),
        "gossip (Alg. 2)": {"method": "gossip"},
    }
    print(
        "\nmedian step (ms) on 4 engines, loopback, MLP 64-512-512-10; straggler = rank 1 at "
        "0.5x speed, or + 20 ms per step (emulated); others' mean wait and comm per step"
    )
    print(
        f"{'scheme':<22} {'straggler':<10} {'median step':>12} {'others wait':>12} "
        f"{'others comm':>12}"
    )
    cases = {"none": None, "0.5x speed": {1: 0.5}, "+20 ms": {1: Straggler(delay=0.02)}}
    for name, opts in schemes.items():
        for label, slow in cases.items():
            result = train_data_parallel(
                cluster,
                model=partial(MLP, 64, (512, 512)),
                dataset=load_digits,
                config=steps_config,
                stragglers=slow,
                **opts,
            )
            by_step: dict[int, float] = {}
            for r in result.records:
                by_step[r["step"]] = max(by_step.get(r["step"], 0.0), r["total_s"])
            others = [r for r in result.records if r["rank"] != 1]
            wait = statistics.mean(r["wait_s"] for r in others)
            comm = statistics.mean(r["comm_s"] + r["sync_s"] for r in others)
            step = statistics.median(by_step.values())
            print(
                f"{name:<22} {label:<10} {1e3 * step:>10.2f}ms {1e3 * wait:>10.2f}ms "
                f"{1e3 * comm:>10.2f}ms"
            )


def main() -> None:
    """Start 4 engines, run both parts, stop the engines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 epoch instead of 3")
    parser.add_argument("--stragglers-only", action="store_true", help="skip the ten configs")
    parser.add_argument(
        "--room",
        action="store_true",
        help="run the ten configurations in an emulated room of 4 PCs, one engine "
        "each, links shaped to 1 Gbit/s (real TCP; root)",
    )
    parser.add_argument(
        "--seeds", type=int, default=1, help="seeds 0..N-1 of the ten; N >= 3 judges the paper"
    )
    parser.add_argument("--store", default=None, help="write the seeds' rows here (JSON)")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="the emulated link's Mbit/s (default 1000, the Gigabit link); 50 us latency",
    )
    args = parser.parse_args()
    link = GIGABIT if args.rate is None else EmulatedLink(bandwidth=args.rate * 1e6 / 8)
    started = time.perf_counter()
    if args.room:
        from course_kit.room.cluster import room_cluster

        try:
            with room_cluster(4, rate="1gbit") as cluster:
                ten_configurations(
                    cluster,
                    epochs=1 if args.quick else 3,
                    link=None,
                    where="emulated room: 4 PCs, links tbf 1 Gbit/s",
                    seeds=args.seeds,
                    store=args.store,
                )
        except RuntimeError as exc:
            raise SystemExit(f"--room: {exc}") from None
        print(f"\nwhole benchmark: {time.perf_counter() - started:.0f} s")
        return
    with start_cluster("local", 4) as cluster:
        if not args.stragglers_only:
            ten_configurations(
                cluster,
                epochs=1 if args.quick else 3,
                link=link,
                seeds=args.seeds,
                store=args.store,
            )
        if args.stragglers_only or args.seeds == 1:
            stragglers(cluster, TrainConfig(num_epochs=1, batch_size=64, lr=0.1, seed=0))
    print(f"\nwhole benchmark: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
