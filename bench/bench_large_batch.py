"""Benchmark (lecture 12): steps to a target accuracy against batch size on digits, and optimisers.

Shallue et al. (2019) measure, for each batch size, the fewest steps to a target with the
learning rate tuned; McCandlish et al. (2018) predict the curve's shape,
$S = S_{min} (1 + B_{crit} / B)$: perfect scaling well below $B_{crit}$, no gain well above it,
and $B_{crit} \\approx B_{noise}$. Here: the MLP on scikit-learn's digits in one process (a
data-parallel run with the same global batch takes the same steps: tests/lib/large_batch/),
SGD with momentum 0.9, the learning rate tuned over a small grid per batch size, several seeds;
printed per batch size: the best grid lr, median steps to the target and the spread over seeds;
then the fitted $B_{crit}$ beside the directly measured $B_{noise}$ at the start and at the
target. Then, at one large batch and the same step budget, SGD + momentum, Adam, LARS and LAMB,
each with its own learning-rate grid. Evaluation every step (not counted as steps).
The results go to ``bench/results/large_batch.json`` (or ``--json``); ``--store`` writes them to
``bench/stored/large_batch.json`` instead, the tracked copy lecture 12 shows (labelled as stored).

    .venv/bin/python bench/bench_large_batch.py            # ~2 minutes on one core
    .venv/bin/python bench/bench_large_batch.py --store    # the same, replacing lecture 12's copy
    .venv/bin/python bench/bench_large_batch.py --quick    # ~30 s, fewer sizes and lrs

``--model lenet`` sweeps the small CNN for digits (LeNet on 8 x 8 images) instead; its results
go to ``bench/results/large_batch_lenet.json`` (``--store``: ``bench/stored/large_batch_lenet.json``,
beside the MLP's; a short setting may be stored for it). ``--skip-optimizers`` leaves out the
optimiser comparison.

    .venv/bin/python bench/bench_large_batch.py --model lenet --quick --max-steps 2000 \\
        --skip-optimizers --store                          # 17 minutes here (loaded)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.data.digits import load_digits  # noqa: E402
from course_lib.parallel.large_batch.critical_batch import fit_steps_model, tune_batch  # noqa: E402
from course_lib.parallel.large_batch.noise_scale import direct_noise_scale  # noqa: E402
from course_lib.training.loop import seed_everything  # noqa: E402
from course_lib.training.models import MLP, build_model  # noqa: E402

STORED = ROOT / "bench" / "stored" / "large_batch.json"  # tracked: lecture 12 shows it
RESULTS = ROOT / "bench" / "results" / "large_batch.json"  # ignored by git: any run's

#: Each optimiser's learning-rate grid at large batch (LARS's lr is the global one, scaled
#: down by its trust coefficient 0.001; LAMB's is a fraction of each layer's weight norm).
OPTIMIZER_GRIDS = {
    "sgd": [0.1, 0.2, 0.4, 0.8],
    "adam": [0.003, 0.01, 0.03, 0.1],
    "lars": [5.0, 10.0, 20.0, 40.0],
    "lamb": [0.01, 0.03, 0.1, 0.3],
}


def noise_scale_at(target: float | None, seed: int = 0, model: str = "mlp") -> float:
    """Return the direct B_noise at initialisation (``target`` None) or where batch 32 reaches it."""
    seed_everything(seed)
    net = MLP() if model == "mlp" else build_model(model)
    if target is not None:  # train with a safe small batch until the target, then measure there
        X, y = load_digits().tensors
        X_test, y_test = load_digits(train=False).tensors
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        for step in range(10_000):
            idx = torch.randint(len(X), (32,), generator=torch.Generator().manual_seed(step))
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            optimizer.step()
            with torch.no_grad():
                if (net(X_test).argmax(1) == y_test).float().mean().item() >= target:
                    break
    return direct_noise_scale(net, load_digits(), batch_size=8)["noise_scale"]


def sweep_batches(batches: list[int], lrs: list[float], seeds: list[int], args) -> list[dict]:
    """Print and return, per batch size, the tuned lr and steps to the target per seed (SGD)."""
    print(
        f"steps to test accuracy {args.target} ({args.model}, digits, SGD momentum 0.9, "
        f"{len(seeds)} seeds)"
    )
    print(f"{'batch':>6} {'best lr':>8} {'median':>7} {'min':>6} {'max':>6}   steps per seed")
    rows = []
    for batch in batches:
        best = tune_batch(
            batch, lrs, seeds, target=args.target, max_steps=args.max_steps, model=args.model
        )
        if best is None:
            print(f"{batch:>6}  no lr in the grid reached the target on every seed")
            continue
        rows.append({"batch": batch, "lr": best.lr, "steps": list(best.steps)})
        print(
            f"{batch:>6} {best.lr:>8g} {best.median:>7g} {min(best.steps):>6} "
            f"{max(best.steps):>6}   {list(best.steps)}"
        )
    return rows


def compare_optimizers(batch: int, seeds: list[int], args) -> list[dict]:
    """Print and return each optimiser's tuned lr and steps to the target at one large batch."""
    print(f"\nat batch {batch}, the same budget of {args.max_steps} steps, each lr tuned:")
    print(f"{'optimizer':>9} {'best lr':>8} {'median':>7} {'min':>6} {'max':>6}   steps per seed")
    rows = []
    for name, grid in OPTIMIZER_GRIDS.items():
        momentum = 0.9 if name in ("sgd", "lars") else 0.0
        best = tune_batch(
            batch,
            grid[1:3] if args.quick else grid,
            seeds,
            target=args.target,
            max_steps=args.max_steps,
            optimizer=name,
            momentum=momentum,
            model=args.model,
        )
        row = {"optimizer": name, "momentum": momentum, "grid": grid}
        if best is None:
            print(f"{name:>9}  no lr in the grid reached the target on every seed")
        else:
            row.update(lr=best.lr, steps=list(best.steps))
            print(
                f"{name:>9} {best.lr:>8g} {best.median:>7g} {min(best.steps):>6} "
                f"{max(best.steps):>6}   {list(best.steps)}"
            )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batch sizes and lrs")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--optimizer-batch", type=int, default=512, help="batch of the comparison")
    parser.add_argument("--json", type=Path, help=f"write the results here (default {RESULTS})")
    parser.add_argument("--store", action="store_true", help=f"write them to {STORED} (tracked)")
    parser.add_argument("--model", choices=("mlp", "lenet"), default="mlp")
    parser.add_argument("--skip-optimizers", action="store_true", help="no optimiser comparison")
    args = parser.parse_args()
    stored_path, results_path = STORED, RESULTS
    if args.model != "mlp":
        stored_path = STORED.with_name(f"large_batch_{args.model}.json")
        results_path = RESULTS.with_name(f"large_batch_{args.model}.json")
    if args.store and args.json:
        parser.error("--store writes lecture 12's copy: drop --json")
    if args.store and args.model == "mlp" and (args.quick or args.skip_optimizers):
        parser.error("--store keeps lecture 12's copy of the full MLP sweep: drop --quick")
    torch.set_num_threads(1)  # one core: the machine is shared
    batches = [8, 32, 128, 512] if args.quick else [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    lrs = (
        [0.02, 0.08, 0.32, 1.28] if args.quick else [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]
    )
    seeds = list(range(args.seeds))
    start = time.perf_counter()
    rows = sweep_batches(batches, lrs, seeds, args)
    s_min, b_crit = fit_steps_model(
        [r["batch"] for r in rows], [statistics.median(r["steps"]) for r in rows]
    )
    b_start = noise_scale_at(None, model=args.model)
    b_target = noise_scale_at(args.target, model=args.model)
    print(f"fit S = S_min (1 + B_crit/B): S_min = {s_min:.1f} steps, B_crit = {b_crit:.0f}")
    print(
        f"B_noise measured directly: {b_start:.0f} at initialisation, {b_target:.0f} at the target"
    )
    optimizers = (
        [] if args.skip_optimizers else compare_optimizers(args.optimizer_batch, seeds, args)
    )
    seconds = time.perf_counter() - start
    print(f"({seconds:.0f} s)")
    out = stored_path if args.store else (args.json or results_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    stored = {
        "command": " ".join(["python bench/bench_large_batch.py", *sys.argv[1:]]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "seconds": round(seconds),
        "model": (
            "MLP(64, (128,), 10)" if args.model == "mlp" else "LeNet(image_size=8), the small CNN"
        )
        + " on digits (1500 train / 297 test), one process",
        "target": args.target,
        "max_steps": args.max_steps,
        "seeds": seeds,
        "lr_grid": lrs,
        "rows": rows,
        "s_min": s_min,
        "b_crit": b_crit,
        "b_noise_start": b_start,
        "b_noise_target": b_target,
        "optimizer_batch": args.optimizer_batch,
        "optimizers": optimizers,
    }
    out.write_text(json.dumps(stored, indent=1) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
