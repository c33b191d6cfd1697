"""Benchmark: why int8 + error feedback lost accuracy on source 000's U-Net, in one process.

Simulates N ranks through source 000's star in one process (each rank's gradient on its share of
the global batch, each rank's own compressor and residuals, the server's mean compressed again
on the way down unless ``down`` is off, Adam on the decoded mean): the same arithmetic as
``train_data_parallel(method="compressed", carrier="parameter_server")`` without engines or
links, so a variant costs one process's compute. It prints, per variant, the test accuracy and
mIoU after the budget and the share of the mean gradient's values that are exactly zero.

Then it measures the mechanism on one coordinate: Adam given the same sum of gradients, once per
step or in bursts every k steps (what error feedback turns a flushed value into), moves about
sqrt(k) times less; plain SGD moves the same.

    .venv/bin/python bench/bench_ef_diagnosis.py                 # 5 variants, ~3 min quiet
    .venv/bin/python bench/bench_ef_diagnosis.py --epochs 4      # shorter
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.compression.base import mean_in_rank_order  # noqa: E402
from course_lib.compression.registry import make_compressor  # noqa: E402
from course_lib.data import load_dataset  # noqa: E402
from course_lib.papers.source000_table import source000_unet  # noqa: E402
from course_lib.training.loop import evaluate, seed_everything  # noqa: E402

VARIANTS = {  # name -> (compressor settings, granularity, compress the downlink)
    "float32": ({"name": "none"}, "flat", False),
    "int8 truncate, one scale (source)": ({"name": "int8"}, "flat", True),
    "int8 truncate, one scale, exact downlink": ({"name": "int8"}, "flat", False),
    "int8 nearest, one scale": ({"name": "int8", "rounding": "nearest"}, "flat", True),
    "int8 truncate, scale per tensor": ({"name": "int8"}, "tensor", True),
}


def simulate(settings: dict, granularity: str, down: bool, args) -> tuple[dict, float]:
    """Train the U-Net as ``args.ranks`` simulated ranks; return test metrics and zero share."""
    seed_everything(0)
    net, loss_fn = source000_unet(), nn.CrossEntropyLoss(ignore_index=255)
    X, Y = load_dataset("segmentation", num_tiles=args.tiles, tile_size=16).tensors
    test = load_dataset("segmentation", train=False, num_tiles=16, tile_size=16)
    names, params = zip(*net.named_parameters(), strict=True)
    bounds = np.cumsum([0] + [p.numel() for p in params])
    settings = dict(settings)
    name = settings.pop("name")
    ef = name != "none"
    ranks = [make_compressor(name, error_feedback=ef, **settings) for _ in range(args.ranks)]
    server = make_compressor(name, error_feedback=ef, **settings)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)

    def pieces(flat: np.ndarray) -> list[tuple[str, np.ndarray]]:
        if granularity == "flat":
            return [("flat", flat)]
        return [(n, flat[bounds[i] : bounds[i + 1]]) for i, n in enumerate(names)]

    def through(comp, flat: np.ndarray, prefix: str = "") -> np.ndarray:
        out = [
            comp.decompress(comp.compress(v, prefix + n)[0]).reshape(-1) for n, v in pieces(flat)
        ]
        return np.concatenate(out)

    per_rank, batch = 2, 2 * args.ranks
    order, zeros = torch.Generator().manual_seed(0), []
    for _ in range(args.epochs):
        perm = torch.randperm(len(X), generator=order)
        for s in range(len(X) // batch):
            idx = perm[s * batch : (s + 1) * batch]
            decoded = []
            for r, comp in enumerate(ranks):
                net.zero_grad()
                mine = idx[r * per_rank : (r + 1) * per_rank]
                loss_fn(net(X[mine]), Y[mine]).backward()
                flat = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
                decoded.append(through(comp, flat))
            mean = mean_in_rank_order(decoded)
            if down and ef:
                mean = through(server, mean, "down/")
            zeros.append(float((mean == 0).mean()))
            grad = torch.from_numpy(mean)
            for i, p in enumerate(params):
                p.grad = grad[bounds[i] : bounds[i + 1]].reshape(p.shape).clone()
            optimizer.step()
    return evaluate(net, DataLoader(test, batch_size=16), loss_fn), float(np.mean(zeros))


def adam_movement(k: int, steps: int = 96) -> float:
    """Return how far Adam (lr 1) moves one weight given gradient 1 per step, sent as k every k."""
    w = torch.zeros(1, requires_grad=True)
    adam = torch.optim.Adam([w], lr=1.0)
    for t in range(1, steps + 1):
        w.grad = torch.tensor([float(k) if t % k == 0 else 0.0])
        adam.step()
    return -w.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tiles", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=12, help="the budget (8 steps an epoch)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    steps = args.epochs * (args.tiles // (2 * args.ranks))
    print(
        f"# {args.ranks} simulated ranks, star, UNet(16, 4), Adam 3e-3, {steps} steps, "
        "error feedback on every int8 variant (machine shared: loaded)"
    )
    print(f"{'variant':<42} {'acc %':>6} {'mIoU %':>7} {'zeros in the mean':>18} {'s':>5}")
    for name in args.variants:
        started = time.perf_counter()
        metrics, zeros = simulate(*VARIANTS[name], args)
        print(
            f"{name:<42} {100 * metrics['accuracy']:>6.1f} {100 * metrics['miou']:>7.1f} "
            f"{100 * zeros:>17.2f}% {time.perf_counter() - started:>5.0f}",
            flush=True,
        )
    print("\n# Adam, one weight, 96 steps, gradient sum 96 sent in bursts of k (SGD moves 96)")
    for k in (1, 2, 4, 8, 16, 32):
        print(
            f"k = {k:>2}: Adam moves {adam_movement(k):5.1f} lr  (96 / sqrt(k) = {96 / k**0.5:5.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
