"""Benchmark the synchronisation schemes with and without a straggler: seconds per epoch on 4 engines.

Trains ``SmallCNN`` (source 001's CIFAR model, 2.2 MB of float32 gradients) on synthetic
CIFAR-shaped batches (random images: only timing is measured) on 4 local engines over gloo:
bulk-synchronous (ring allreduce on all 4 ranks), Local-SGD(4), and the parameter server of
lecture 5 (rank 0 serves, 3 workers) asynchronous, stale-synchronous with s = 1 and s = 0 —
each once with all engines at full speed and once with the last rank at half speed (an
emulated straggler: it sleeps as long again after each backward). Prints seconds per epoch
(an epoch: every sample once; for the server, ``samples / per-worker batch`` gradients), the
slow-down the straggler causes, gradients per worker and the staleness the server recorded.
All engines share this PC's cores, so on a 2-core machine the figures measure contention too.

    .venv/bin/python bench/bench_async.py            # 3 runs per cell, median (about 6 min loaded)
    .venv/bin/python bench/bench_async.py --quick --repeats 1    # one run of fewer samples
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.cluster import start_cluster  # noqa: E402
from course_lib.parallel.asynchronous.train import train_asynchronous  # noqa: E402
from course_lib.parallel.data_parallel.stragglers import Straggler  # noqa: E402
from course_lib.parallel.data_parallel.train import train_data_parallel  # noqa: E402
from course_lib.training.loop import TrainConfig  # noqa: E402
from course_lib.training.models import SmallCNN  # noqa: E402

ENGINES = 4
HALF_SPEED = {ENGINES - 1: Straggler(speed=0.5)}


def synthetic_cifar(size: int):
    """Return ``size`` random 3x32x32 images with labels 0-9 (the same on every engine)."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g)
    )


def run_sync(cluster, data, method: str, config: TrainConfig, stragglers, **options) -> dict:
    """Return seconds per epoch (first step, which pays set-up, left out) and steps per rank."""
    result = train_data_parallel(
        cluster,
        model=SmallCNN,
        dataset=data,
        config=config,
        method=method,
        stragglers=stragglers,
        **options,
    )
    times = result.history.step_times
    per_step = statistics.mean(times[1:]) if len(times) > 1 else times[0]
    steps = len(times) // config.num_epochs
    return {"epoch_s": per_step * steps, "steps": f"{steps} each", "staleness": "-"}


def run_async(cluster, data, bound, config: TrainConfig, stragglers) -> dict:
    """Return seconds per epoch of the server's run, gradients per worker and the staleness."""
    result = train_asynchronous(
        cluster,
        model=SmallCNN,
        dataset=data,
        config=config,
        staleness_bound=bound,
        stragglers=stragglers,
    )
    last = max(a["apply_at"][1] for a in result.applied)
    seconds = last - result.started
    stale = [a["staleness"] for a in result.applied]
    return {
        "epoch_s": seconds / config.num_epochs,
        "steps": "/".join(str(result.applied_per_worker[w]) for w in result.workers),
        "staleness": f"mean {statistics.mean(stale):.2f}, max {max(stale)}",
    }


def main(argv: list[str] | None = None) -> int:
    """Run every scheme with and without the straggler; print one row per scheme."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="240 samples instead of 480")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (median shown)")
    args = parser.parse_args(argv)
    samples = 240 if args.quick else 480
    data = synthetic_cifar(samples)
    config = TrainConfig(num_epochs=1, batch_size=48, lr=0.01, seed=0)
    schemes = [
        ("bulk-synchronous (ring)", lambda cl, s: run_sync(cl, data, "ring", config, s)),
        ("Local-SGD(4)", lambda cl, s: run_sync(cl, data, "local_sgd", config, s, period=4)),
        ("asynchronous", lambda cl, s: run_async(cl, data, None, config, s)),
        ("SSP s=1", lambda cl, s: run_async(cl, data, 1, config, s)),
        ("SSP s=0", lambda cl, s: run_async(cl, data, 0, config, s)),
    ]
    started = time.perf_counter()
    with start_cluster("local", ENGINES) as cluster:
        run_sync(cluster, data, "ring", config, None)  # warm-up: connections, imports
        rows = []
        for name, run in schemes:
            evens = [run(cluster, None) for _ in range(args.repeats)]
            slows = [run(cluster, HALF_SPEED) for _ in range(args.repeats)]
            even = {"epoch_s": statistics.median(r["epoch_s"] for r in evens)}
            slow = {**slows[-1], "epoch_s": statistics.median(r["epoch_s"] for r in slows)}
            rows.append((name, even, slow))
    print(
        f"{ENGINES} engines, SmallCNN, {samples} synthetic samples per epoch, global batch "
        f"{config.batch_size}; straggler: rank {ENGINES - 1} at half speed (emulated); "
        f"median of {args.repeats} runs"
    )
    head = f"{'scheme':<24} {'s/epoch':>8} {'straggler':>10} {'ratio':>6}  {'gradients per worker (straggler run)':<38} staleness (straggler run)"
    print(head)
    print("-" * len(head))
    for name, even, slow in rows:
        ratio = slow["epoch_s"] / even["epoch_s"]
        print(
            f"{name:<24} {even['epoch_s']:>8.2f} {slow['epoch_s']:>10.2f} {ratio:>6.2f}  "
            f"{slow['steps']:<38} {slow['staleness']}"
        )
    print(f"(measured; took {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
