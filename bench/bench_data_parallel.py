"""Benchmark data-parallel training: each exchange method on 1, 2, 4 engines, three kinds of link.

Trains ``SmallCNN`` (545 098 parameters, 2.2 MB of float32 gradients; source 001's CIFAR model)
for a few steps on synthetic CIFAR-shaped batches (random images: only timing is measured here)
with every gradient-exchange method over gloo: on local engines over the real loopback link and
the emulated Gigabit link (125 MB/s, 50 us), or (``--room``, root) in an emulated room, one
engine per PC, real TCP through links shaped to 1 Gbit/s. Prints, per configuration, the median
step and its breakdown (compute, wait, comm after backward, optimiser step), the time all
buckets spent communicating (overlapped methods), the epoch, scaling efficiency (samples/s
against N x one engine's), and the cost model's prediction of the communication part (labelled
as a prediction) beside the measured one, with its error. On the emulated link the prediction
uses the link's own alpha, beta (it proves nothing: the emulation is the model). On real links
two calibrations are compared: the ping-pong fit (ranks 0 and 1, the others idle) and a fit of
the exchange's own collective timed over every rank (``cost_model.alpha_beta.collective_calibration``),
which also reports its error at 2 MB and 6 MB, sizes it did not fit. Then the speed goals of the
buckets at 32 samples per engine (``--per-engine``), the methods run in turn several times:
after-backward ring / bucketed (goal >= 1.3x) and bucketed / DDP (goal <= 1.2x), beside what
perfect overlap could give (a prediction from the measured compute and first bucket).
``--accuracy`` adds epochs and seconds to a target test accuracy on 1, 2, 4 engines. All local
engines share this PC's cores, so on a 2-core machine 4 engines measure contention as much as
communication; the first line prints the load average.

    .venv/bin/python bench/bench_data_parallel.py             # loopback + emulated, minutes
    .venv/bin/python bench/bench_data_parallel.py --quick     # fewer steps and configurations
    .venv/bin/python bench/bench_data_parallel.py --room      # emulated room (root)
    .venv/bin/python bench/bench_data_parallel.py --accuracy  # + time to a target accuracy
    .venv/bin/python bench/bench_data_parallel.py --goals-only --engines 2 4  # the speed goals
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.cluster import start_cluster  # noqa: E402
from course_lib.comm import GIGABIT  # noqa: E402
from course_lib.cost_model.alpha_beta import LinkModel, predict  # noqa: E402
from course_lib.cost_model.calibration import engine_calibrations  # noqa: E402
from course_lib.parallel.data_parallel.train import COMM_NAME, train_data_parallel  # noqa: E402
from course_lib.parallel.exchanges.base import trainable_parameters  # noqa: E402
from course_lib.parallel.exchanges.bucket_choice import ALGORITHMS as CHOICES  # noqa: E402
from course_lib.parallel.exchanges.buckets import bucket_layout  # noqa: E402
from course_lib.parallel.exchanges.registry import EXCHANGES  # noqa: E402
from course_lib.training.loop import TrainConfig  # noqa: E402
from course_lib.training.models import SmallCNN  # noqa: E402

METHODS = ["parameter_server", "allreduce_naive", "ring", "builtin", "bucketed", "ddp"]
BUCKET_BYTES = 1 << 19  # 512 kB: 2 buckets (the 2.1 MB dense layers; the 77 kB convolutions)


def synthetic_cifar(size: int):
    """Random CIFAR-shaped images and labels (timing only; nothing is learned)."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g)
    )


def predicted_comm(method: str, nbytes: int, n: int, model: LinkModel, chosen=None) -> float:
    """Return the cost model's seconds for one exchange (buckets: one allreduce per bucket, in
    turn, by the algorithm each bucket used, ``chosen``; the ring where not known)."""
    if n == 1:
        return 0.0
    if not EXCHANGES[method].overlaps_backward:  # one collective on the whole gradient
        return predict(EXCHANGES[method].cost_collective, nbytes, n, model)
    params = trainable_parameters(SmallCNN())
    sizes = [4 * sum(params[i].numel() for i in b) for b in bucket_layout(params, BUCKET_BYTES)]
    names = [CHOICES[a] for a in chosen] if chosen else ["ring_allreduce"] * len(sizes)
    return sum(predict(name, s, n, model) for name, s in zip(names, sizes, strict=True))


def chosen_algorithms(result) -> list[str] | None:
    """Return the algorithm each bucket of a bucketed run used (None for other methods)."""
    buckets = result.records[0]["buckets"] if result.records else []
    algorithms = [b.get("algorithm") for b in sorted(buckets, key=lambda b: b["index"])]
    return algorithms if algorithms and all(algorithms) else None


CHECK_SIZES = [2**21, 3 * 2**21]  # 2 MB (about the gradient) and 6 MB: sizes the fits skip


def calibrate(cluster, n: int, methods) -> dict[str, dict[str, LinkModel]]:
    """Per method: its models of the first ``n`` engines' real link (ping-pong; own collective)."""
    algorithms = sorted({EXCHANGES[m].cost_collective for m in methods})
    cal = cluster.client[cluster.ids_by_rank[:n]].apply_sync(
        engine_calibrations, COMM_NAME, algorithms, CHECK_SIZES
    )[0]
    pp = LinkModel(*cal["ping_pong"])
    print(
        f"# {n} ranks: ping-pong fit {pp.bandwidth / 1e6:.0f} MB/s, alpha {pp.alpha * 1e6:.0f} us"
    )
    for algorithm in algorithms:
        own = LinkModel(*cal["fits"][algorithm])
        checks = "; ".join(
            f"{s / 2**20:g} MB {1e3 * t:.1f} ms, predicted {1e3 * predict(algorithm, s, n, own):.1f}"
            f" ({_err(predict(algorithm, s, n, own), t)}; ping-pong "
            f"{_err(predict(algorithm, s, n, pp), t)})"
            for s, t in cal["checks"][algorithm].items()
        )
        print(
            f"#   {algorithm} fit {own.bandwidth / 1e6:.0f} MB/s, alpha {own.alpha * 1e6:.0f} us;"
            f" not fitted: {checks}"
        )
    return {
        m: {"ping-pong": pp, "own fit": LinkModel(*cal["fits"][EXCHANGES[m].cost_collective])}
        for m in methods
    }


def _err(pred: float, measured: float) -> str:
    return f"{100 * (pred / measured - 1):+.0f}%" if measured > 0 else "-"


def run_link(cluster, link_name: str, link, sizes, methods, steps: int, batch: int) -> None:
    """Print one table: every method on 1, 2, 4 engines over ``link`` (None: the real one)."""
    config = TrainConfig(num_epochs=1, batch_size=batch, lr=0.01)
    opts = {"bucketed": {"bucket_bytes": BUCKET_BYTES}, "ddp": {"bucket_bytes": BUCKET_BYTES}}
    data = synthetic_cifar(steps * batch)
    head = (
        f"{'link':<9} {'N':>2} {'method':<17} {'step':>7} {'compute':>8} {'wait':>6} "
        f"{'comm':>7} {'buckets':>8} {'optim':>6} {'epoch s':>7} {'samples/s':>9} "
        f"{'eff.':>5} {'meas.comm':>9} "
        + ("  pred.comm (error)" if link else "  pred. ping-pong fit / own fit (error)")
    )
    print(f"\n{head}\n{'-' * len(head)}")
    base, steps_ms = None, {}
    for n in sizes:
        models = (
            {m: {"emulated link": LinkModel.from_link(link)} for m in methods} if link else None
        )
        for method in methods if n > 1 else ["ring"]:
            t0 = time.perf_counter()
            result = train_data_parallel(
                cluster,
                model="small_cnn",
                dataset=data,
                config=config,
                method=method,
                world_size=n,
                link=link,
                comm_timeout=120,
                timeout=600,
                **opts.get(method, {}),
            )
            if n > 1 and models is None:
                models = calibrate(cluster, n, methods)
            row = _summary(result)
            rate = batch / row["total_s"]
            base = rate if n == 1 else base
            eff = rate / (n * base) if base else float("nan")
            overlapped = EXCHANGES[method].overlaps_backward
            measured = row["bucket_s"] if overlapped else row["comm_s"]
            preds = ""
            if n > 1:
                parts = []
                for m in models[method].values():
                    pred = predicted_comm(
                        method, result.gradient_bytes, n, m, chosen_algorithms(result)
                    )
                    parts.append(f"{1e3 * pred:.1f} ({_err(pred, measured)})")
                preds = "  " + " / ".join(parts)
            label = method if n > 1 else "(one engine)"
            if chosen_algorithms(result) and n > 1:
                label = f"bucketed ({'/'.join(chosen_algorithms(result))})"
            steps_ms[n, method] = 1e3 * row["total_s"]
            print(
                f"{link_name:<9} {n:>2} {label:<17} {1e3 * row['total_s']:>7.1f} "
                f"{1e3 * row['compute_s']:>8.1f} {1e3 * row['wait_s']:>6.1f} "
                f"{1e3 * row['comm_s']:>7.1f} {1e3 * row['bucket_s']:>8.1f} "
                f"{1e3 * row['step_s']:>6.1f} {row['epoch_s']:>7.2f} {rate:>9.0f} "
                f"{eff:>5.2f} {1e3 * measured:>9.1f}{preds}   "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )


def speed_goals(
    cluster, sizes, link, per_engine: int, steps: int, repeats: int, where: str = ""
) -> None:
    """Print the buckets' speed goals: after-backward ring / bucketed (>= 1.3x), bucketed / DDP
    (<= 1.2x), at ``per_engine`` samples per engine, the three methods run in turn ``repeats``
    times (medians of the runs' median steps), and the most perfect overlap could give.

    The bound (a prediction) takes the after-backward ring's step, compute C and the rest R
    (wait + comm), and the fraction w of compute still ahead when the bucketed run's first
    bucket was ready: perfect overlap hides at most w C of R, so the step is at least
    C + max(R - w C, 0) + optimiser step. "auto" buckets can beat it by taking fewer message
    steps than the ring (recursive doubling); the buckets forced onto the ring show overlap
    alone.
    """
    print(
        f"\nspeed goals, {link.label if link else where or 'real link'}, {per_engine} samples per "
        f"engine, {steps} steps, {repeats} runs per method in turn (ms, medians)"
    )
    opts = {"bucketed": {"bucket_bytes": BUCKET_BYTES}, "ddp": {"bucket_bytes": BUCKET_BYTES}}
    for n in [s for s in sizes if s > 1]:
        config = TrainConfig(num_epochs=1, batch_size=per_engine * n, lr=0.01)
        data = synthetic_cifar(steps * per_engine * n)
        # "bucketed/ring": the buckets forced onto the ring, the same algorithm as the baseline,
        # so that its ratio shows what overlap alone gives
        # "bucketed/whole": its rings in whole chunks, one message per step (segments' effect)
        runs: dict[str, list] = {
            "ring": [],
            "bucketed": [],
            "bucketed/ring": [],
            "bucketed/whole": [],
            "ddp": [],
        }
        for _ in range(repeats):
            for key in runs:
                method, _, variant = key.partition("/")
                extra = (
                    {"segment_bytes": None}
                    if variant == "whole"
                    else {"algorithm": variant}
                    if variant
                    else {}
                )
                result = train_data_parallel(
                    cluster,
                    model="small_cnn",
                    dataset=data,
                    config=config,
                    method=method,
                    world_size=n,
                    link=link,
                    comm_timeout=120,
                    timeout=600,
                    **opts.get(method, {}),
                    **extra,
                )
                runs[key].append((_summary(result), result))
        step = {m: statistics.median(r["total_s"] for r, _ in v) for m, v in runs.items()}
        ring = {
            k: statistics.median(r[k] for r, _ in runs["ring"]) for k in ("compute_s", "step_s")
        }
        rest = step["ring"] - ring["compute_s"] - ring["step_s"]
        ahead = statistics.median(
            (rec["compute_at"][1] - min(b["ready"] for b in rec["buckets"]))
            / (rec["compute_at"][1] - rec["compute_at"][0])
            for _, result in runs["bucketed"]
            for rec in result.records
            if rec["step"] >= 1 and rec["buckets"]
        )
        best = ring["compute_s"] + max(rest - ahead * ring["compute_s"], 0.0) + ring["step_s"]
        chosen = "/".join(chosen_algorithms(runs["bucketed"][0][1]) or ["?"])
        print(
            f"  {n} engines: ring after backward {1e3 * step['ring']:.1f}, bucketed "
            f"({chosen}) {1e3 * step['bucketed']:.1f}, bucketed on the ring "
            f"{1e3 * step['bucketed/ring']:.1f} ({step['ring'] / step['bucketed/ring']:.2f}x: "
            f"overlap alone), DDP {1e3 * step['ddp']:.1f}; "
            f"compute {1e3 * ring['compute_s']:.1f}, first bucket ready with "
            f"{100 * ahead:.0f} % of it ahead"
        )
        spread = {m: [r["total_s"] for r, _ in v] for m, v in runs.items()}
        below = sum(b < d for b, d in zip(spread["bucketed"], spread["ddp"], strict=True))
        print(
            f"  {n} engines, each run's median step [range over the {repeats} runs]: "
            + ", ".join(
                f"{m} {1e3 * step[m]:.1f} [{1e3 * min(v):.1f}-{1e3 * max(v):.1f}]"
                for m, v in spread.items()
            )
            + f"; bucketed in whole chunks / in segments {step['bucketed/whole'] / step['bucketed']:.2f}x"
        )
        print(
            f"# {n} engines: ring after backward / bucketed = "
            f"{step['ring'] / step['bucketed']:.2f}x (goal >= 1.3x; perfect overlap of the "
            f"ring's time: {step['ring'] / best:.2f}x, predicted); bucketed / DDP = "
            f"{step['bucketed'] / step['ddp']:.2f}x (goal <= 1.0x: "
            f"{_verdict(spread['bucketed'], spread['ddp'])}; faster than DDP's run beside it "
            f"in {below} of {repeats})",
            flush=True,
        )


def _verdict(ours: list[float], theirs: list[float]) -> str:
    """Judge ours <= theirs from the runs: "met" when our median is at or below every one of
    their runs, "not met" when above every one, else "within noise" (and which side)."""
    mid = statistics.median(ours)
    if mid <= min(theirs):
        return "met"
    if mid > max(theirs):
        return "not met"
    side = "below" if mid <= statistics.median(theirs) else "above"
    return f"within noise, median {side} DDP's"


def time_to_accuracy(cluster, sizes, target: float = 0.93, max_epochs: int = 20) -> None:
    """Print epochs and seconds to ``target`` test accuracy on 1, 2, 4 engines (digits MLP).

    Two regimes: the same global batch on every N (the distributed run equals the one-process
    run, so the epochs are the same and only time changes), and a fixed batch per engine (global
    batch 32 N) with the learning rate scaled by N, Goyal et al.'s linear scaling rule: fewer,
    larger steps per epoch, whose learning dynamics differ.
    """
    from functools import partial

    from course_lib.data.digits import load_digits
    from course_lib.training.models import MLP

    test = load_digits(train=False)
    print(
        f"\ntime to {100 * target:g} % test accuracy, digits MLP 64-128-10, builtin allreduce "
        f"(gloo), at most {max_epochs} epochs; seconds = sum of the epochs' times on rank 0"
    )
    print(
        f"{'regime':<26} {'N':>2} {'batch':>5} {'lr':>5} {'epochs':>6} {'seconds':>8} "
        f"{'s/epoch':>8} {'speed-up':>8}"
    )
    runs = {}  # one engine is the same run in both regimes: trained once
    for regime in ("same global batch 32", "32 per engine, lr x N"):
        first = None
        for n in sizes:
            batch, lr = (32, 0.1) if regime.startswith("same") else (32 * n, 0.1 * n)
            config = TrainConfig(
                num_epochs=max_epochs,
                batch_size=batch,
                lr=lr,
                seed=0,
                target=target,
                target_metric="test_accuracy",
            )
            if (n, batch) not in runs:
                runs[n, batch] = train_data_parallel(
                    cluster,
                    model=partial(MLP, 64, (128,)),
                    dataset=load_digits,
                    config=config,
                    method="builtin",
                    world_size=n,
                    test_set=test,
                    measure_wait=False,
                )
            result = runs[n, batch]
            epochs = result.history.epochs_to_reach("test_accuracy", target)
            used = result.history.epochs[: epochs or len(result.history.epochs)]
            seconds = sum(e["epoch_time"] for e in used)
            first = seconds if first is None else first
            shown = f"{epochs:>6}" if epochs else f">{max_epochs:>5}"
            print(
                f"{regime:<26} {n:>2} {batch:>5} {lr:>5.2g} {shown} {seconds:>8.2f} "
                f"{seconds / len(used):>8.3f} {first / seconds:>7.2f}x",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 steps, 1 and 2 engines only")
    parser.add_argument("--engines", type=int, nargs="*", default=None)
    parser.add_argument("--methods", nargs="*", default=METHODS, choices=METHODS)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 8)")
    parser.add_argument(
        "--room",
        action="store_true",
        help="run in an emulated room instead: one engine per PC, links shaped "
        "to 1 Gbit/s (real TCP; root)",
    )
    parser.add_argument(
        "--accuracy",
        action="store_true",
        help="also time 1, 2, 4 engines to a target test accuracy (digits MLP)",
    )
    parser.add_argument(
        "--goals-only",
        action="store_true",
        help="only the buckets' speed goals on the emulated link (or the room)",
    )
    parser.add_argument(
        "--per-engine",
        type=int,
        default=32,
        help="samples per engine in the speed goals (default 32)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per method in the speed goals (default 3)"
    )
    args = parser.parse_args(argv)
    if min(args.engines or [1]) < 1 or args.per_engine < 1 or args.repeats < 1:
        parser.error("--engines, --per-engine and --repeats need positive whole numbers")
    goal_steps = args.steps or 10
    sizes = args.engines or ([1, 2] if args.quick else [1, 2, 4])
    steps = args.steps or (4 if args.quick else 8)
    batch = 32
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"SmallCNN, global batch {batch}, {steps} steps (median of steps 2..), gloo; "
        f"load average {load}{' (loaded)' if os.getloadavg()[0] > 2 else ''}; times in ms; "
        "'pred.' is the cost model's prediction of the communication part ('meas.comm': "
        "comm after backward, or the buckets' own time for bucketed / ddp); 'epoch s': the "
        f"{steps}-step epoch, {steps} x the median step"
    )
    started = time.perf_counter()
    if args.room:
        from course_kit.room.cluster import room_cluster

        try:
            with room_cluster(max(sizes), rate="1gbit") as cluster:
                if not args.goals_only:
                    run_link(cluster, "room", None, sizes, args.methods, steps, batch)
                speed_goals(
                    cluster,
                    sizes,
                    None,
                    args.per_engine,
                    goal_steps,
                    args.repeats,
                    "room: one engine per PC, real TCP, 1 Gbit/s tbf links",
                )
                if args.accuracy:
                    time_to_accuracy(cluster, sizes)
        except RuntimeError as exc:
            raise SystemExit(f"--room: {exc}") from None
    else:
        with start_cluster("local", max(sizes)) as cluster:
            for link_name, link in (("loopback", None), ("emulated", GIGABIT)):
                if not args.goals_only:
                    run_link(cluster, link_name, link, sizes, args.methods, steps, batch)
            speed_goals(cluster, sizes, GIGABIT, args.per_engine, goal_steps, args.repeats)
            if args.accuracy:
                time_to_accuracy(cluster, sizes)
    print(f"\nwhole benchmark: {time.perf_counter() - started:.0f} s")
    return 0


def _summary(result) -> dict[str, float]:
    """Median over steps 2.. and over ranks of each phase; the slowest rank's total."""
    recs = [r for r in result.records if r["step"] >= 1] or result.records
    row = {
        k: statistics.median(r[k] for r in recs)
        for k in ("compute_s", "wait_s", "comm_s", "step_s")
    }
    row["total_s"] = statistics.median(
        max(r["total_s"] for r in recs if r["step"] == s) for s in {r["step"] for r in recs}
    )
    row["epoch_s"] = len({r["step"] for r in result.records}) * row["total_s"]
    row["bucket_s"] = statistics.median(
        sum(b["end"] - b["start"] for b in r["buckets"]) for r in recs
    )
    return row


if __name__ == "__main__":
    raise SystemExit(main())
