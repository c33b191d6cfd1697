"""Benchmark checkpoints: file size, save time (atomic, fsynced) and load time (verified) per model.

For each course model with an Adam optimiser that has taken one step (so its state is full), it
prints the file size, the median time of ``save_checkpoint`` (serialise, SHA-256, write, fsync,
rename, fsync of the folder) and of ``load_checkpoint`` (read, check, ``torch.load``), and the
save time of a plain ``torch.save`` to the same disk for comparison: the price of atomicity and
durability.

    .venv/bin/python bench/bench_checkpoint.py              # MLP, LeNet, SmallCNN, UNet
    .venv/bin/python bench/bench_checkpoint.py --repeats 9 --folder /mnt/shared
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.checkpoint import load_checkpoint, rank_state, save_checkpoint  # noqa: E402
from course_lib.checkpoint.state import make_checkpoint  # noqa: E402
from course_lib.training.loop import History, TrainConfig  # noqa: E402
from course_lib.training.models import build_model, param_count  # noqa: E402

MODELS = ("mlp", "lenet", "small_cnn", "unet")


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--folder", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        print(
            f"{'model':10} {'params':>9} {'file MB':>8} {'save ms':>8} {'load ms':>8} "
            f"{'torch.save ms':>14}"
        )
        for name in MODELS:
            net = build_model(name)
            optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
            for p in net.parameters():
                p.grad = torch.randn_like(p)
            optimizer.step()  # Adam's moments now exist: a checkpoint's realistic size
            ckpt = make_checkpoint(
                net,
                optimizer,
                TrainConfig(optimizer="adam"),
                History(),
                epochs_done=1,
                steps_done=0,
                ranks=[rank_state(torch.Generator(), None)],
            )
            folder = Path(tmp) / name
            path = save_checkpoint(folder, ckpt)
            save = _median_time(lambda: save_checkpoint(folder, ckpt), args.repeats)  # noqa: B023
            load = _median_time(lambda: load_checkpoint(path, net=net), args.repeats)  # noqa: B023
            plain = _median_time(lambda: torch.save(ckpt, folder / "plain.pt"), args.repeats)  # noqa: B023
            print(
                f"{name:10} {param_count(net):>9} {path.stat().st_size / 1e6:>8.2f} "
                f"{save * 1e3:>8.1f} {load * 1e3:>8.1f} {plain * 1e3:>14.1f}"
            )


if __name__ == "__main__":
    main()
