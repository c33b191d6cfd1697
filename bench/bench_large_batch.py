"""Benchmark (lecture 12, a sketch): steps to a target accuracy against batch size on digits.

Shallue et al. (2019) measure, for each batch size, the fewest steps to a target with the
learning rate tuned; McCandlish et al. (2018) predict the curve's shape,
$S = S_{min} (1 + B_{crit} / B)$: perfect scaling well below $B_{crit}$, no gain well above it,
and $B_{crit} \\approx B_{noise}$. Here: the MLP on scikit-learn's digits in one process (a
data-parallel run with the same global batch takes the same steps: tests/test_large_batch_*),
SGD with momentum 0.9, the learning rate tuned over a small grid per batch size, several seeds;
printed per batch size: the best grid lr, median steps to the target and the spread over seeds;
then the fitted $B_{crit}$ beside the directly measured $B_{noise}$ at the start and at the
target. Evaluation every step (not counted as steps).

    .venv/bin/python bench/bench_large_batch.py            # ~5 minutes on one core
    .venv/bin/python bench/bench_large_batch.py --quick    # ~1 minute
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.data.digits import load_digits  # noqa: E402
from course_lib.parallel.large_batch.noise_scale import direct_noise_scale  # noqa: E402
from course_lib.training.loop import seed_everything  # noqa: E402
from course_lib.training.models import MLP  # noqa: E402


def steps_to_target(batch: int, lr: float, seed: int, target: float, max_steps: int) -> int | None:
    """Return the optimiser steps until the test accuracy first reaches ``target`` (None: never)."""
    seed_everything(seed)
    net = MLP()
    X, y = load_digits().tensors
    X_test, y_test = load_digits(train=False).tensors
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(seed)
    step = 0
    while step < max_steps:
        order = torch.randperm(len(X), generator=generator)
        for idx in order[: len(X) // batch * batch].split(batch):  # full batches only
            optimizer.zero_grad(set_to_none=True)
            loss_fn(net(X[idx]), y[idx]).backward()
            optimizer.step()
            step += 1
            with torch.no_grad():
                accuracy = (net(X_test).argmax(1) == y_test).float().mean().item()
            if accuracy >= target:
                return step
            if step >= max_steps or not np.isfinite(loss_fn(net(X[idx]), y[idx]).item()):
                return None
    return None


def noise_scale_at(target: float | None, seed: int = 0) -> float:
    """Return the direct B_noise at initialisation (``target`` None) or where batch 32 reaches it."""
    seed_everything(seed)
    net = MLP()
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


def fit_steps_model(batches: list[int], steps: list[float]) -> tuple[float, float]:
    """Return ``(S_min, B_crit)`` of $S = S_{min}(1 + B_{crit}/B)$, least squares in log steps.

    Log space weighs every batch size alike (in steps the small batches' hundreds would drown
    the large ones' tens); for each B_crit on a fine grid, the best S_min is closed-form.
    """
    b, log_s = np.array(batches, float), np.log(steps)
    best = (np.inf, 0.0, 0.0)
    for b_crit in np.geomspace(0.1, 1e5, 2000):
        shape = np.log1p(b_crit / b)
        log_s_min = float(np.mean(log_s - shape))
        err = float(np.sum((log_s - log_s_min - shape) ** 2))
        best = min(best, (err, float(np.exp(log_s_min)), float(b_crit)))
    return best[1], best[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batch sizes and lrs")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core: the machine is shared
    batches = [8, 32, 128, 512] if args.quick else [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    lrs = (
        [0.02, 0.08, 0.32, 1.28] if args.quick else [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]
    )
    seeds = list(range(args.seeds))
    start = time.perf_counter()
    rows = []
    print(
        f"steps to test accuracy {args.target} (MLP, digits, SGD momentum 0.9, {len(seeds)} seeds)"
    )
    print(f"{'batch':>6} {'best lr':>8} {'median':>7} {'min':>6} {'max':>6}   steps per seed")
    for batch in batches:
        best = None
        for lr in lrs:
            steps = [steps_to_target(batch, lr, s, args.target, args.max_steps) for s in seeds]
            if any(s is None for s in steps):
                continue  # a setting that misses the target on some seed is not a candidate
            if best is None or statistics.median(steps) < statistics.median(best[1]):
                best = (lr, steps)
        if best is None:
            print(f"{batch:>6}  no lr in the grid reached the target on every seed")
            continue
        lr, steps = best
        rows.append({"batch": batch, "lr": lr, "steps": steps})
        print(
            f"{batch:>6} {lr:>8g} {statistics.median(steps):>7g} {min(steps):>6} "
            f"{max(steps):>6}   {steps}"
        )
    s_min, b_crit = fit_steps_model(
        [r["batch"] for r in rows], [statistics.median(r["steps"]) for r in rows]
    )
    b_start, b_target = noise_scale_at(None), noise_scale_at(args.target)
    print(f"fit S = S_min (1 + B_crit/B): S_min = {s_min:.1f} steps, B_crit = {b_crit:.0f}")
    print(
        f"B_noise measured directly: {b_start:.0f} at initialisation, {b_target:.0f} at the target"
    )
    print(f"({time.perf_counter() - start:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "target": args.target,
                    "rows": rows,
                    "s_min": s_min,
                    "b_crit": b_crit,
                    "b_noise_start": b_start,
                    "b_noise_target": b_target,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
