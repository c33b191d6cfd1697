"""Benchmark data-parallel training: each exchange method on 1, 2, 4 engines, loopback and emulated.

Trains ``SmallCNN`` (545 098 parameters, 2.2 MB of float32 gradients; source 001's CIFAR model)
for a few steps on synthetic CIFAR-shaped batches (random images: only timing is measured here)
with every gradient-exchange method, on local engines over gloo, on the real loopback link and on
the emulated Gigabit link (125 MB/s, 50 us). Prints, per configuration, the median step and its
breakdown (compute, wait, comm after backward, optimiser step), the time all buckets spent
communicating (overlapped methods), scaling efficiency (samples/s against N x one engine's),
and the cost model's prediction of the communication part (labelled as a prediction) beside the
measured one. On the emulated link the prediction uses the link's own alpha, beta; on loopback a
ping-pong fit between ranks 0 and 1. All engines share this PC's cores, so on a 2-core machine
4 engines measure contention as much as communication.

    .venv/bin/python bench/bench_data_parallel.py             # a few minutes
    .venv/bin/python bench/bench_data_parallel.py --quick     # fewer steps and configurations
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
from course_lib.comm import GIGABIT  # noqa: E402
from course_lib.cost_model import LinkModel, predict  # noqa: E402
from course_lib.models import SmallCNN  # noqa: E402
from course_lib.parallel.buckets import bucket_layout  # noqa: E402
from course_lib.parallel.data_parallel import COMM_NAME, train_data_parallel  # noqa: E402
from course_lib.parallel.exchange import trainable_parameters  # noqa: E402
from course_lib.parallel.replica import engine_link_model  # noqa: E402
from course_lib.training import TrainConfig  # noqa: E402

METHODS = ["parameter_server", "allreduce_naive", "ring", "builtin", "bucketed", "ddp"]
BUCKET_BYTES = 1 << 19  # 512 kB: 5 buckets for the 2.2 MB gradient
ALGORITHM = {"parameter_server": "star_allreduce", "allreduce_naive": "allreduce_naive",
             "ring": "ring_allreduce", "builtin": "ring_allreduce"}  # fmt: skip


def synthetic_cifar(size: int):
    """Random CIFAR-shaped images and labels (timing only; nothing is learned)."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(size, 3, 32, 32, generator=g),
                         torch.randint(0, 10, (size,), generator=g))  # fmt: skip


def predicted_comm(method: str, nbytes: int, n: int, model: LinkModel) -> float:
    """Return the cost model's seconds for one exchange (buckets: one ring per bucket, in turn)."""
    if n == 1:
        return 0.0
    if method in ALGORITHM:
        return predict(ALGORITHM[method], nbytes, n, model)
    params = trainable_parameters(SmallCNN())
    sizes = [4 * sum(params[i].numel() for i in b) for b in bucket_layout(params, BUCKET_BYTES)]
    return sum(predict("ring_allreduce", s, n, model) for s in sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 steps, 1 and 2 engines only")
    parser.add_argument("--engines", type=int, nargs="*", default=None)
    parser.add_argument("--methods", nargs="*", default=METHODS, choices=METHODS)
    args = parser.parse_args(argv)
    sizes = args.engines or ([1, 2] if args.quick else [1, 2, 4])
    steps = 4 if args.quick else 8
    batch = 32
    config = TrainConfig(num_epochs=1, batch_size=batch, lr=0.01)
    opts = {"bucketed": {"bucket_bytes": BUCKET_BYTES}, "ddp": {"bucket_bytes": BUCKET_BYTES}}
    print(f"SmallCNN, global batch {batch}, {steps} steps (median of steps 2..), gloo, local "
          "engines; times in ms; 'pred. comm' is the cost model's prediction")  # fmt: skip
    head = (f"{'link':<9} {'N':>2} {'method':<17} {'step':>7} {'compute':>8} {'wait':>6} "
            f"{'comm':>7} {'buckets':>8} {'optim':>6} {'pred.comm':>9} {'samples/s':>9} "
            f"{'eff.':>5}")  # fmt: skip
    with start_cluster("local", max(sizes)) as cluster:
        data = synthetic_cifar(steps * batch)
        base: dict[str, float] = {}
        for link_name, link in (("loopback", None), ("emulated", GIGABIT)):
            print(f"\n{head}\n{'-' * len(head)}")
            for n in sizes:
                real_model = None
                for method in args.methods if n > 1 else ["ring"]:
                    t0 = time.perf_counter()
                    result = train_data_parallel(
                        cluster, model="small_cnn", dataset=data,
                        config=config, method=method, world_size=n, link=link,
                        comm_timeout=120, timeout=600, **opts.get(method, {}),
                    )  # fmt: skip
                    if n > 1 and link is None and real_model is None:
                        ids = cluster.ids_by_rank[:n]
                        fits = cluster.client[ids].apply_sync(engine_link_model, COMM_NAME)
                        real_model = LinkModel(*fits[0])
                    model = LinkModel.from_link(link) if link else real_model
                    row = _summary(result)
                    pred = predicted_comm(method, result.gradient_bytes, n, model) if model else 0
                    rate = batch / row["total_s"]
                    if n == 1:
                        base[link_name] = rate
                    eff = rate / (n * base[link_name]) if link_name in base else float("nan")
                    label = method if n > 1 else "(one engine)"
                    print(f"{link_name:<9} {n:>2} {label:<17} {1e3 * row['total_s']:>7.1f} "
                          f"{1e3 * row['compute_s']:>8.1f} {1e3 * row['wait_s']:>6.1f} "
                          f"{1e3 * row['comm_s']:>7.1f} {1e3 * row['bucket_s']:>8.1f} "
                          f"{1e3 * row['step_s']:>6.1f} {1e3 * pred:>9.1f} {rate:>9.0f} "
                          f"{eff:>5.2f}   ({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return 0


def _summary(result) -> dict[str, float]:
    """Median over steps 2.. and over ranks of each phase; the slowest rank's total."""
    recs = [r for r in result.records if r["step"] >= 1] or result.records
    row = {k: statistics.median(r[k] for r in recs)
           for k in ("compute_s", "wait_s", "comm_s", "step_s")}  # fmt: skip
    row["total_s"] = statistics.median(
        max(r["total_s"] for r in recs if r["step"] == s) for s in {r["step"] for r in recs}
    )
    row["bucket_s"] = statistics.median(
        sum(b["end"] - b["start"] for b in r["buckets"]) for r in recs
    )
    return row


if __name__ == "__main__":
    raise SystemExit(main())
