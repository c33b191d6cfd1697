"""Benchmark lecture 11's ZeRO stages against data parallelism on the emulated Gigabit link.

Trains an MLP on digits (64-1024-1024-10: 1.13 M parameters, 4.5 MB of float32 gradients) with
Adam for a few steps on 4 local engines over gloo, the link emulated as Gigabit (125 MB/s,
50 us), with ``zero0`` (the ring allreduce, every rank the whole state), ``zero1``, ``zero2``,
``zero3`` and PyTorch DDP (``ddp``). Prints per method the median step and its parts, the bytes
each rank sent per step against the auditor's formula, the model-state bytes per rank from the
ledger against the formula, and the step time as a ratio to ``zero0``'s (the issue's aim for
stage 3: <= 1.6x DDP's with its allgathers overlapped; this stage 3 does not overlap them
yet). All local engines share this PC's cores: on 2 cores the compute is slowed by contention.

    .venv/bin/python bench/bench_sharded.py            # 4 engines, 8 steps
    .venv/bin/python bench/bench_sharded.py --engines 2 --steps 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from course_lib.cluster import start_cluster  # noqa: E402
from course_lib.comm import GIGABIT  # noqa: E402
from course_lib.demo import digits_subset  # noqa: E402 - importable: travels to engines by name
from course_lib.parallel.data_parallel.train import train_data_parallel  # noqa: E402
from course_lib.parallel.sharded.audit import audit_bytes  # noqa: E402
from course_lib.parallel.sharded.ledger import formula_bytes  # noqa: E402
from course_lib.parallel.sharded.units import unit_sizes  # noqa: E402
from course_lib.training.loop import TrainConfig  # noqa: E402
from course_lib.training.models import MLP  # noqa: E402

METHODS = ["zero0", "zero1", "zero2", "zero3", "ddp"]
HIDDEN = (1024, 1024)
BUCKET_BYTES = 1 << 20


def main() -> None:
    """Run every method on the emulated Gigabit link and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    n, batch = args.engines, 16 * args.engines
    config = TrainConfig(num_epochs=1, batch_size=batch, lr=1e-3, optimizer="adam", seed=0)
    model = partial(MLP, 64, HIDDEN)
    psi = sum(p.numel() for p in model().parameters())
    print(
        f"MLP 64-{'-'.join(map(str, HIDDEN))}-10, {psi:,} parameters, {n} engines, Adam, "
        f"global batch {batch}, {args.steps} steps, emulated Gigabit"
    )
    head = f"{'method':>7} {'step ms':>8} {'comm ms':>8} {'sync ms':>8} {'x zero0':>8} "
    print(head + f"{'sent MB':>8} {'formula':>8} {'state MB':>9} {'formula':>8}")
    base = None
    with start_cluster("local", n) as cluster:
        for method in METHODS:
            options = {"bucket_bytes": BUCKET_BYTES} if method.startswith("zero") else {}
            result = train_data_parallel(
                cluster,
                model=model,
                dataset=partial(digits_subset, batch * args.steps),
                config=config,
                method=method,
                link=GIGABIT,
                comm_timeout=120,
                timeout=900,
                **options,
            )
            rows = result.summary()
            step = statistics.median(r["total_s"] for r in rows)
            comm = statistics.median(r["comm_s"] for r in rows)
            sync = statistics.median(r["sync_s"] for r in rows)
            base = base or step
            sent = statistics.median(r["bytes_sent"] for r in rows) / 1e6
            line = f"{method:>7} {1e3 * step:>8.1f} {1e3 * comm:>8.1f} {1e3 * sync:>8.1f} "
            line += f"{step / base:>8.2f} "
            line += f"{sent:>8.2f} " if method != "ddp" else f"{'(gloo)':>8} "  # not counted p2p
            if method.startswith("zero"):
                stage = int(method[-1])
                units = unit_sizes(model(), stage, n, BUCKET_BYTES)
                audit = audit_bytes(result.records, stage, units, n)
                formula = statistics.median(r["formula"] for r in audit) / 1e6
                late = [r for r in result.records if r["step"] >= 1]
                held = max(r["ledger_settled_bytes"] for r in late) / 1e6
                line += f"{formula:>8.2f} {held:>9.2f} {formula_bytes(stage, psi, n) / 1e6:>8.2f}"
                line += "" if all(r["ok"] for r in audit) else "  BYTES DIFFER FROM THE AUDITOR"
            print(line, flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
