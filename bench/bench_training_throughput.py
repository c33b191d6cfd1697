"""Training throughput (images / s) of each course model on this machine's CPU, at a fixed batch.

One training step = forward, backward and an SGD update (``course_lib.training.loop.train_step``) on a
batch of random inputs of the model's input shape; the data do not change the cost. Each model
gets warm-up steps, then ``--repeats`` timed steps; the table shows the median step time and
images / s = batch size / median. Later lectures use these figures to say how much compute one
step costs next to the time its gradient takes on the wire (the last column).

    .venv/bin/python bench/bench_training_throughput.py            # batch 32, all models
    .venv/bin/python bench/bench_training_throughput.py --batch-size 8 --threads 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from course_lib.training.loop import seed_everything, train_step
from course_lib.training.models import MLP, LeNet, SmallCNN, UNet, grad_bytes, param_count

# name -> (constructor, input shape of one sample, what it stands for)
MODELS = {
    "MLP (digits)": (lambda: MLP(), (1, 8, 8)),
    "LeNet (digits 8x8)": (lambda: LeNet(), (1, 8, 8)),
    "LeNet (MNIST 28x28)": (lambda: LeNet(28), (1, 28, 28)),
    "SmallCNN (CIFAR 32x32)": (lambda: SmallCNN(), (3, 32, 32)),
    "UNet (64x64 tiles)": (lambda: UNet(), (3, 64, 64)),
}


def measure(name: str, batch_size: int, repeats: int, warmup: int) -> dict:
    """Return the median step time and throughput of model ``name`` on the CPU."""
    make, shape = MODELS[name]
    seed_everything(0)
    net = make()
    X = torch.rand(batch_size, *shape)
    with torch.no_grad():
        out_shape = net(X[:1]).shape
    y = torch.randint(0, out_shape[1], (batch_size, *out_shape[2:]))
    loss_fn, optimizer = nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(warmup):
        train_step(net, X, y, loss_fn, optimizer)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        train_step(net, X, y, loss_fn, optimizer)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {
        "model": name,
        "parameters": param_count(net),
        "gradient_MB": grad_bytes(net) / 1e6,
        "median_step_ms": 1000 * median,
        "iqr_ms": 1000
        * (statistics.quantiles(times, n=4)[2] - statistics.quantiles(times, n=4)[0]),
        "images_per_s": batch_size / median,
        # Time to send one float32 gradient over Gigabit Ethernet (125 MB/s, source 000's room).
        "gradient_on_1Gbit_ms": 1000 * grad_bytes(net) / 125e6,
    }


def main() -> None:
    """Measure every model and print a table of medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    if args.batch_size < 1 or args.repeats < 2:
        parser.error("--batch-size must be >= 1 and --repeats >= 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [measure(name, args.batch_size, args.repeats, args.warmup) for name in args.models]
    print(
        f"CPU training throughput, batch {args.batch_size}, median of {args.repeats} steps, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}"
    )
    header = (
        f"{'model':<24}{'params':>10}{'grad MB':>9}{'step ms':>10}{'IQR ms':>9}"
        f"{'images/s':>10}{'1Gbit ms':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['model']:<24}{r['parameters']:>10,}{r['gradient_MB']:>9.3f}"
            f"{r['median_step_ms']:>10.2f}{r['iqr_ms']:>9.2f}{r['images_per_s']:>10.0f}"
            f"{r['gradient_on_1Gbit_ms']:>10.2f}"
        )
    print("1Gbit ms: time to send one float32 gradient at 125 MB/s (a prediction, not measured)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"batch_size": args.batch_size, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
