"""Benchmark (lecture 12): the noise scale from the allreduce against the direct one, like for like.

``NoiseScaleExchange`` estimates $B_{noise} = \\mathrm{tr}(\\Sigma)/|G|^2$ from the gradients a
data-parallel step already averages, smoothed over the last steps (an EMA, decay 0.95: ~20
steps). The reference, ``direct_noise_scale``, takes one set of weights in one process and
computes every example's gradient. Two comparisons on 4 engines, the digits MLP, global batch
128 (4 ranks of 32), for several seeds:

1. **while training** (lr 0.05, momentum 0.9): the allreduce's value at the last step against
   the direct one at the final weights. Not like for like: the EMA averages steps whose
   weights were different, so this shows how much the weights' movement biases it.
2. **at matched weights**: the engines measure at the same final weights held fixed (lr 1e-12:
   the weights do not change, checked), ``epochs`` epochs of batches; against the direct
   estimate at those weights. Printed: the EMA at the last step (what training shows) and the
   ratio of the mean estimates over all steps. Also at the initial weights.

With ``--live``: instead, what showing B_noise live costs: the same run (6 epochs of batch 64,
138 steps) with ``progress=False`` and with ``progress=True`` (rank 0 sends its B_noise with
its step count, at most 4 times a second), alternated, rank 0's median step time of each.

    .venv/bin/python bench/bench_noise_scale.py             # ~2-3 minutes on 2 cores
    .venv/bin/python bench/bench_noise_scale.py --seeds 5 --epochs 8
    .venv/bin/python bench/bench_noise_scale.py --live --seeds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.cluster import start_cluster  # noqa: E402
from course_lib.data.digits import load_digits  # noqa: E402
from course_lib.parallel.data_parallel.train import train_data_parallel  # noqa: E402
from course_lib.parallel.exchanges.base import RingAllreduce  # noqa: E402
from course_lib.parallel.large_batch.noise_scale import (  # noqa: E402
    NoiseScaleExchange,
    direct_noise_scale,
    noise_scale_at_fixed_weights,
)
from course_lib.training.loop import TrainConfig, seed_everything  # noqa: E402
from course_lib.training.models import MLP  # noqa: E402


def one_seed(cluster, seed: int, args) -> dict[str, float]:
    """Return the allreduce and direct estimates of one seed, while training and matched."""
    seed_everything(seed)
    net = MLP()
    start = noise_scale_at_fixed_weights(
        cluster, net, load_digits, batch_size=args.batch, epochs=args.epochs, seed=seed
    )
    config = TrainConfig(
        num_epochs=args.train_epochs, lr=0.05, momentum=0.9, batch_size=args.batch, seed=seed
    )
    run = train_data_parallel(
        cluster,
        model=net,
        dataset=load_digits,
        config=config,
        method=NoiseScaleExchange(RingAllreduce(), smoothing=0.95),
    )
    last = max((r for r in run.records if r["rank"] == 0), key=lambda r: r["step"])
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.from_numpy(run.weights[name]))
    end = noise_scale_at_fixed_weights(
        cluster, net, load_digits, batch_size=args.batch, epochs=args.epochs, seed=seed
    )
    moving_direct = direct_noise_scale(net, load_digits(), batch_size=1)["noise_scale"]
    for point in (start, end):
        assert point["weights_moved"] == 0.0, point["weights_moved"]
    return {
        "training_allreduce": last["noise_scale"],
        "training_direct": moving_direct,
        "start_ema": start["allreduce"],
        "start_mean": start["allreduce_mean"],
        "start_direct": start["direct"],
        "end_ema": end["allreduce"],
        "end_mean": end["allreduce_mean"],
        "end_direct": end["direct"],
        "steps": end["steps"],
    }


def live_cost(cluster, seeds: int) -> None:
    """Print rank 0's median step time with and without the live B_noise, runs alternated."""
    times: dict[bool, list[float]] = {False: [], True: []}
    shown = 0
    for seed in range(seeds):
        for progress in (False, True):
            run = train_data_parallel(
                cluster,
                model=MLP,
                dataset=load_digits,
                config=TrainConfig(num_epochs=6, lr=0.05, momentum=0.9, batch_size=64, seed=seed),
                method=NoiseScaleExchange(RingAllreduce()),
                progress=progress,
            )
            times[progress] += [r["total_s"] for r in run.records if r["rank"] == 0][1:]
            shown += len(run.published)
    off, on = (statistics.median(times[p]) * 1e3 for p in (False, True))
    print(
        f"\n# rank 0's median step, {seeds} runs each, alternated: without the live B_noise "
        f"{off:.2f} ms, with it {on:.2f} ms ({on / off - 1:+.0%}); {shown} values shown live"
    )


def main(argv: list[str] | None = None) -> int:
    """Start 4 engines, compare for each seed, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128, help="global batch (4 ranks)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs measured at fixed weights")
    parser.add_argument("--train-epochs", type=int, default=3, help="epochs of training first")
    parser.add_argument("--live", action="store_true", help="only the live display's cost")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cluster = start_cluster(n=4)
    try:
        if args.live:
            live_cost(cluster, args.seeds)
            return 0
        rows = [one_seed(cluster, seed, args) for seed in range(args.seeds)]
    finally:
        cluster.stop()
    print(
        f"\n# B_noise on digits, MLP, 4 engines, global batch {args.batch}; direct: every "
        f"example's gradient at the same weights (one process); allreduce: EMA 0.95 at the "
        f"last step, and mean tr(Sigma) / mean |G|^2 over all {rows[0]['steps']} steps"
    )
    head = f"{'seed':>4} {'where':<44} {'allreduce':>10} {'direct':>8} {'ratio':>6}"
    print(head + "\n" + "-" * len(head))
    ratios: dict[str, list[float]] = {}
    for seed, r in enumerate(rows):
        lines = [
            (f"while training, last step ({args.train_epochs} epochs)", "training_allreduce",
             "training_direct"),
            ("initial weights held, EMA at the last step", "start_ema", "start_direct"),
            ("initial weights held, mean over the steps", "start_mean", "start_direct"),
            ("trained weights held, EMA at the last step", "end_ema", "end_direct"),
            ("trained weights held, mean over the steps", "end_mean", "end_direct"),
        ]  # fmt: skip
        for where, a, d in lines:
            ratio = r[a] / r[d]
            ratios.setdefault(where, []).append(ratio)
            print(f"{seed:>4} {where:<44} {r[a]:>10.1f} {r[d]:>8.1f} {ratio:>6.2f}")
    print("\nratio allreduce / direct, median [min-max] over the seeds:")
    for where, values in ratios.items():
        print(
            f"  {where:<44} {statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
