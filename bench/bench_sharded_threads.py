"""Stress lecture 11's stage 3 and its two threads: many short runs on one pool of engines.

Stage 3 runs its collectives on a communication thread while the training thread computes; both
touch the model's tensors from Python (the gathered unit's storage, the gradients, the ledger's
samples). PyTorch aborts the process when a storage's Python object is freed on one thread while
the other references it ("THPStorage_dealloc ... use_count() == 1 INTERNAL ASSERT FAILED"), so a
missing lock shows up as an engine dying once in a few hundred runs: before the ledger's lock
covered both threads, this script lost an engine after 38, 127, 343, 964 and 992 runs; after it,
none in 1 701 (2026-11-30, 2 cores, 300 s). It runs ``zero0``, stage 3 inline and stage 3
prefetching on 2, 3 and 4 engines in turn (an MLP of 1 375 values, 4 Adam steps on digits) until
an engine dies or ``--seconds`` pass, and prints the runs done; on a death, the dead engine's last
output (its abort message) and exit status 1.

    .venv/bin/python bench/bench_sharded_threads.py --seconds 300
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.cluster import start_cluster  # noqa: E402
from course_lib.parallel.data_parallel.train import train_data_parallel  # noqa: E402
from course_lib.parallel.sharded import Zero3  # noqa: E402
from course_lib.training.loop import TrainConfig  # noqa: E402

ADAM = TrainConfig(num_epochs=1, batch_size=48, lr=3e-3, optimizer="adam", seed=7)


def small_digits():
    """The first 192 training digits: 4 global batches of 48 (imports inside: sent by value)."""
    from torch.utils.data import TensorDataset

    from course_lib.data.digits import load_digits

    x, y = load_digits().tensors
    return TensorDataset(x[:192], y[:192])


def uneven_mlp():
    """64-15-15-10: three modules of 975, 240 and 160 values, so three stage-3 units."""
    from torch import nn

    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 15), nn.ReLU(), nn.Linear(15, 15), nn.ReLU(), nn.Linear(15, 10)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="how long to keep trying")
    args = parser.parse_args(argv)
    started, runs = time.time(), 0
    with start_cluster("local", 4) as cluster:
        while time.time() - started < args.seconds:
            for n in (2, 3, 4):
                for method in ("zero0", Zero3(1024, prefetch=False), Zero3(1024)):
                    try:
                        train_data_parallel(
                            cluster,
                            model=uneven_mlp,
                            dataset=small_digits,
                            config=ADAM,
                            method=method,
                            world_size=n,
                            comm_timeout=30,
                            timeout=120,
                        )
                    except Exception as exc:  # noqa: BLE001 - a death is the finding
                        print(f"an engine died after {runs} runs ({method}, {n} engines): {exc}")
                        for engines in cluster.owned.engines.values():
                            output = engines.get_output() or ""
                            abort = output.find("terminate called")
                            print(output[abort : abort + 600] if abort >= 0 else output[-600:])
                        return 1
                    runs += 1
    print(f"{runs} runs in {time.time() - started:.0f} s, no engine died")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
