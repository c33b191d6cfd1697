"""Benchmark (lecture 12): time to a target accuracy in the emulated room, for batch sizes and PCs.

Two questions of lecture 12, answered with real TCP over shaped links (one engine per PC, the
digits MLP, SGD with momentum 0.9, the test accuracy checked after every epoch):

1. **Batch ramp-up against a fixed batch** (Smith et al. 2018; source 000's first idea): the
   same starting batch and learning rate, the batch doubled at the given epochs, against the
   batch kept with the lr kept (the kit's first baseline) and against the batch kept with the
   lr *halved* at the same epochs (``StepDecay``: Smith et al.'s baseline, the same schedule of
   SGD's noise scale lr/B). Fewer steps per epoch are fewer exchanges per epoch; printed per
   scheme: exchanges per epoch, epochs, steps (= exchanges) and seconds of training to the
   target, median [min–max] over the seeds.
2. **How many PCs** (Goyal et al. 2017): a fixed batch per PC, so the global batch grows with
   the PCs, and the learning rate scaled linearly with a warm-up of one epoch. More PCs make
   each step's compute shorter per sample but add an exchange; past the critical batch they
   also need more samples. Printed per N: the measured steps and seconds to the target, and
   the *prediction* (the steps measured here × (one PC's step, measured, + the ring's
   alpha-beta time over the room's link, fitted on the ring itself in this run)), so the N
   that minimises time to target is shown measured and predicted.

Training seconds are the sum of the epochs' training time (evaluation not counted). Needs root,
``ip``, ``tc`` and ``unshare``; the machine's load shows in every figure (2 cores for 4 PCs).

    .venv/bin/python bench/bench_large_batch_room.py                      # ~4 minutes
    .venv/bin/python bench/bench_large_batch_room.py --rate 100mbit --seeds 5
    .venv/bin/python bench/bench_large_batch_room.py --part 1           # ramp-up only
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.comm import setup_communicators  # noqa: E402
from course_lib.cost_model.alpha_beta import LinkModel, predict  # noqa: E402
from course_lib.cost_model.calibration import engine_calibrations  # noqa: E402
from course_lib.data.digits import load_digits  # noqa: E402
from course_lib.parallel.data_parallel.train import train_data_parallel  # noqa: E402
from course_lib.training.batch_schedules import BatchRampUp  # noqa: E402
from course_lib.training.loop import TrainConfig  # noqa: E402
from course_lib.training.lr_schedules import LinearScalingWarmup, StepDecay  # noqa: E402

COMM_NAME = "room_comm"
FIT_SIZES = [2**13, 2**15, 2**17, 2**19, 2**21]  # 8 KB .. 2 MB: the latency and the rate


def to_target(cluster, config: TrainConfig, world_size: int) -> dict:
    """Train until ``config.target``; return epochs, steps and training seconds (None: missed)."""
    result = train_data_parallel(
        cluster,
        model="mlp",
        dataset=load_digits,
        config=config,
        method="ring",
        world_size=world_size,
        test_set=load_digits(train=False),
        measure_wait=False,
        timeout=900,
    )
    history = result.history
    reached = history.epochs_to_reach("test_accuracy", config.target)
    per_epoch: dict[int, int] = {}
    for r in result.records:
        if r["rank"] == 0:
            per_epoch[r["epoch"]] = per_epoch.get(r["epoch"], 0) + 1
    return {
        "exchanges_per_epoch": [per_epoch[e] for e in sorted(per_epoch)],
        "epochs": reached,
        "steps": len(history.step_times) if reached else None,
        "seconds": sum(e["epoch_time"] for e in history.epochs) if reached else None,
        "step_s": _step_seconds(result),
        "gradient_bytes": result.gradient_bytes,
    }


def _step_seconds(result) -> float:
    """Return rank 0's median seconds of a whole step (compute, exchange, optimiser)."""
    return statistics.median(r["total_s"] for r in result.records if r["rank"] == 0)


def spread(values: list) -> str:
    """Return "median [min–max]" of the runs that reached the target, and how many missed."""
    got = [v for v in values if v is not None]
    if not got:
        return "never"
    missed = len(values) - len(got)
    text = f"{statistics.median(got):.3g} [{min(got):.3g}–{max(got):.3g}]"
    return text + (f" ({missed} missed)" if missed else "")


def ramp_up_vs_fixed(cluster, args) -> None:
    """Part 1: the same start, a batch doubled at ``args.milestones`` against a fixed one."""
    ms = args.milestones
    schemes = {  # label: (batch schedule, lr schedule): two separate runs, never both at once
        f"fixed batch {args.batch}, lr kept": (None, None),
        f"fixed batch, lr /2 at epochs {ms}": (None, StepDecay(milestones=ms, factor=2)),
        f"batch x2 at epochs {ms}, lr kept": (BatchRampUp(milestones=ms), None),
    }
    print(f"\n# 1. ramp-up vs fixed batch, {args.pcs} PCs, target {args.target:.0%}", flush=True)
    print(
        f"{'scheme':<36} {'exchanges/epoch':>16} {'epochs':>14} {'steps (exchanges)':>20} "
        f"{'seconds':>22}"
    )
    for label, (batch_schedule, lr_schedule) in schemes.items():
        runs = [
            to_target(
                cluster,
                TrainConfig(
                    num_epochs=args.epochs,
                    batch_size=args.batch,
                    lr=args.lr,
                    momentum=0.9,
                    seed=seed,
                    target=args.target,
                    batch_schedule=batch_schedule,
                    lr_schedule=lr_schedule,
                ),
                args.pcs,
            )
            for seed in range(args.seeds)
        ]
        per_epoch = max((r["exchanges_per_epoch"] for r in runs), key=len)
        print(
            f"{label:<36} {'/'.join(map(str, dict.fromkeys(per_epoch))):>16} "
            f"{spread([r['epochs'] for r in runs]):>14} "
            f"{spread([r['steps'] for r in runs]):>20} {spread([r['seconds'] for r in runs]):>22}",
            flush=True,
        )


def pcs_to_target(cluster, args, link: LinkModel) -> None:
    """Part 2: batch per PC fixed, lr scaled linearly with warm-up; measured vs predicted."""
    sizes = [n for n in (1, 2, 4, 8) if n <= args.pcs]
    print(
        f"\n# 2. PCs against time to target: {args.per_pc} samples per PC, lr {args.lr} x "
        f"global batch / {args.per_pc} with one epoch of warm-up (measured; predicted: the "
        f"steps measured x (one PC's step measured + the ring's alpha-beta time over the fitted link))",
        flush=True,
    )
    print(
        f"{'PCs':>4} {'global batch':>13} {'steps':>20} {'seconds measured':>22} "
        f"{'seconds predicted':>18}"
    )
    alone, measured, predicted_s = None, {}, {}
    for n in sizes:
        runs = []
        for seed in range(args.seeds):
            config = TrainConfig(
                num_epochs=args.epochs,
                batch_size=args.per_pc * n,
                lr=args.lr,
                momentum=0.9,
                seed=seed,
                target=args.target,
                lr_schedule=LinearScalingWarmup(reference_batch=args.per_pc, warmup_epochs=1),
            )
            runs.append(to_target(cluster, config, n))
        if alone is None:  # one PC, no exchange: what every PC's step costs besides it
            alone = statistics.median(r["step_s"] for r in runs)
        exchange = predict("ring_allreduce", runs[0]["gradient_bytes"], n, link) if n > 1 else 0
        step_s = alone + exchange
        steps = [r["steps"] for r in runs if r["steps"] is not None]
        predicted = f"{statistics.median(steps) * step_s:.3g}" if steps else "never"
        seconds = [r["seconds"] for r in runs if r["seconds"] is not None]
        if seconds:
            measured[n] = statistics.median(seconds)
            predicted_s[n] = statistics.median(steps) * step_s
        print(
            f"{n:>4} {args.per_pc * n:>13} {spread([r['steps'] for r in runs]):>20} "
            f"{spread([r['seconds'] for r in runs]):>22} {predicted:>18}",
            flush=True,
        )
    if measured:
        print(
            f"fewest seconds to the target: {min(measured, key=measured.get)} PC(s) measured, "
            f"{min(predicted_s, key=predicted_s.get)} predicted"
        )


def room_link(cluster) -> LinkModel:
    """Return alpha, beta of the room's links as the ring allreduce sees them (fitted here).

    The kit's ring is timed on every PC at sizes around the MLP's 38 KB gradient (and up to 2 MB, so that the rate is fitted too) and its own
    formula fitted (:func:`course_lib.cost_model.alpha_beta.collective_calibration`): the
    latency a step pays in the room (veth, tbf, TCP, gloo) is far above a cable's 50 us.
    """
    setup_communicators(cluster, backend="gloo", name=COMM_NAME)
    fit = cluster.view.apply_sync(
        engine_calibrations, COMM_NAME, ["ring_allreduce"], [], FIT_SIZES, 5
    )[0]
    link = LinkModel(*fit["fits"]["ring_allreduce"])
    print(
        f"# the room's links, ring allreduce fitted at {FIT_SIZES[0] // 1024}-"
        f"{FIT_SIZES[-1] // 1024} KB: alpha {link.alpha * 1e6:.0f} us, "
        f"{link.bandwidth / 1e6:.0f} MB/s (measured in this run)",
        flush=True,
    )
    return link


def main(argv: list[str] | None = None) -> int:
    """Build the room, run both parts, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pcs", type=int, default=4, help="PCs in the room (one engine each)")
    parser.add_argument("--rate", default="1gbit", help="every link's tc tbf rate")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("--epochs", type=int, default=16, help="the most epochs a run may take")
    parser.add_argument("--batch", type=int, default=64, help="part 1's starting global batch")
    parser.add_argument("--milestones", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--per-pc", type=int, default=32, help="part 2's batch per PC")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--part", type=int, choices=(1, 2), help="run only part 1 or part 2")
    args = parser.parse_args(argv)
    args.milestones = tuple(args.milestones)
    if args.pcs < 2:
        parser.error(f"--pcs {args.pcs}: a room needs at least 2 PCs")
    if args.batch % args.pcs:
        parser.error(f"--batch {args.batch} does not split over {args.pcs} PCs: use a multiple")

    from course_kit.room.build import room_unavailable_reason
    from course_kit.room.cluster import room_cluster

    reason = room_unavailable_reason()
    if reason:
        print(f"cannot build an emulated room here: {reason}", file=sys.stderr)
        return 2
    with room_cluster(args.pcs, args.rate) as cluster:
        if args.part != 1:
            link = room_link(cluster)
        if args.part != 2:
            ramp_up_vs_fixed(cluster, args)
        if args.part != 1:
            pcs_to_target(cluster, args, link)
    print("\n(every figure measured in this run on a shared machine, except the predicted column)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
