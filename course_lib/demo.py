"""Lecture 4 in one command, ``./kit demo``, the kit's headless main job: start engines, check them, train with several exchange methods.

Run it with ``./kit demo`` (or ``python -m course_lib.demo --engines 4 --methods ring,ddp``).
Every method trains the same digits MLP for the same steps through
:func:`~course_lib.parallel.data_parallel.train.train_data_parallel`; each row of the table is measured
in this run and compared with one process trained on the whole global batch
(:mod:`course_lib.parallel.data_parallel.reference`).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

# torch, ipyparallel and the library are imported where they are used, after the arguments are
# checked: bad input is answered in a fraction of a second instead of after seconds of imports.
if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import Subset

    from course_lib.cluster import CourseCluster
    from course_lib.parallel.data_parallel.train import DataParallelResult

__all__ = ["BATCH", "DEFAULT_METHODS", "MAX_STEPS", "demo_methods", "digits_subset", "main", "make_mlp",
           "method_row", "round_trip_seconds"]  # fmt: skip

DEFAULT_METHODS = ("parameter_server", "ring", "bucketed", "ddp")
BATCH = 64  # the global batch (rounded down to a multiple of the engines)
MAX_STEPS = 1500 // BATCH  # one pass over the 1 500 training digits (course_lib.data.digits)
CONFIG = {"lr": 0.2, "momentum": 0.9, "seed": 0}  # 20 steps reach about 89 % test accuracy
OPTIONS = {"bucketed": {"bucket_bytes": 4096}, "ddp": {"bucket_bytes": 4096}}  # 2 buckets


def demo_methods() -> list[str]:
    """Return the methods the demo runs: bulk-synchronous and uncompressed, as their classes say.

    Each should equal one process (source 000's published averaging is the exception, kept for
    teaching: its row says DIFFERS). Imports torch: call it after the cheap checks.
    """
    from course_lib.parallel.exchanges.registry import EXCHANGES

    return [n for n, c in EXCHANGES.items() if c.averages_every_step and not c.compresses]


def make_mlp() -> nn.Module:
    """Return the MLP 64-128-10 of ``bench_data_parallel`` (9 610 weights, 38 kB of gradient)."""
    from course_lib.training.models import MLP

    return MLP(64, (128,))


def digits_subset(size: int) -> Subset:
    """Return the first ``size`` training digits (built on every engine and here alike)."""
    from torch.utils.data import Subset

    from course_lib.data.digits import load_digits

    return Subset(load_digits(), range(size))


def warm_up() -> int:
    """Import torch and load the digits (on an engine, while the reference trains); count them."""
    return len(digits_subset(0).dataset)


def round_trip_seconds(cluster: CourseCluster, repeats: int = 30) -> float:
    """Return the median time of a trivial ``%px``-style execute on all engines."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        cluster.view.execute("pass", block=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def method_row(result: DataParallelResult, single: dict[str, Any]) -> dict[str, Any]:
    """Return one method's medians over steps 2.. (ms, kB per rank) and its distance from one process."""
    from course_lib.parallel.data_parallel.reference import (
        ATOL,
        max_weight_difference,
        weights_match,
    )

    recs = [r for r in result.records if r["step"] >= 1] or result.records
    row: dict[str, Any] = {"method": result.method}
    # The step ends when the slowest rank is done: median over steps of the slowest rank's total.
    row["step"] = 1e3 * statistics.median(
        max(r["total_s"] for r in recs if r["step"] == s) for s in {r["step"] for r in recs}
    )
    for phase in ("compute", "wait", "comm"):
        row[phase] = 1e3 * statistics.median(r[f"{phase}_s"] for r in recs)
    for key in ("bytes_sent", "collective_bytes"):  # each rank's median step, in kB
        per_rank = [
            statistics.median(r[key] for r in recs if r["rank"] == k) / 1e3
            for k in range(result.world_size)
        ]
        row[key], row[f"max_{key}"] = statistics.mean(per_rank), max(per_rank)
    row["diff"] = max_weight_difference(result.weights, single)  # rank 0's; replicas below
    row["replicas"] = result.max_replica_difference
    row["equal"] = weights_match(result.weights, single) and row["replicas"] <= ATOL
    return row


#: The table's numeric columns: ``method_row`` key -> (heading, width, format).
COLUMNS = {"step": ("step", 6, ".2f"), "compute": ("compute", 7, ".2f"), "wait": ("wait", 6, ".2f"),
           "comm": ("comm", 6, ".2f"), "bytes_sent": ("sent kB", 7, ".1f"),
           "max_bytes_sent": ("max", 6, ".1f"), "collective_bytes": ("gloo kB", 7, ".1f"),
           "diff": ("max|w-w1|", 9, ".1e"), "seconds": ("run s", 5, ".1f")}  # fmt: skip


def format_row(row: dict[str, Any] | None, width: int) -> str:
    """Return the table line of :func:`method_row`'s ``row`` (the heading for None)."""
    from course_lib.parallel.exchanges.registry import EXCHANGES

    if row is None:
        cells = [f"{head:>{w}}" for head, w, _ in COLUMNS.values()]
        return f"{'method':<{width}} {' '.join(cells)}  verdict"
    overlapped = EXCHANGES[row["method"]].overlaps_backward  # it does not stop to wait
    cells = [
        "-".rjust(w) if key == "wait" and overlapped else f"{row[key]:>{w}{fmt}}"
        for key, (_, w, fmt) in COLUMNS.items()
    ]
    verdict = "= one process" if row["equal"] else "DIFFERS from one process"
    if row["replicas"] > 0:
        verdict += f" (replicas differ by {row['replicas']:.1e})"
    return f"{row['method']:<{width}} {' '.join(cells)}  {verdict}"


LEGEND = """\
step: the slowest rank's; compute: forward + backward (DDP reduces inside backward: its time is
here); wait: for the slowest rank ('-': overlapped methods do not stop for it); comm: after
backward. sent kB: point-to-point, mean over ranks (max: the busiest rank, e.g. the server);
gloo kB: handed to gloo's own collectives, per rank. '= one process': every weight within
2e-5 + 1e-4 |w| of one process trained on the whole global batch (float32 rounding only)."""


def held_out_accuracy(weights: dict[str, Any]) -> float:
    """Return the accuracy of the MLP with ``weights`` on the held-out digits."""
    import torch

    from course_lib.data.digits import load_digits

    net = make_mlp()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    X, y = load_digits(train=False).tensors
    with torch.no_grad():
        return float((net(X).argmax(dim=1) == y).float().mean())


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the fix (the rule for ``./kit`` jobs)."""

    def error(self, message: str) -> NoReturn:
        hint = " (see ./kit demo --help)" if message.startswith("argument") else ""
        self.exit(2, f"kit demo: {message}{hint}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and validate the command line; exit with one line naming the fix on bad input."""
    parser = _Parser(prog="./kit demo", description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=None, help="engine count (default: 2-4)")
    parser.add_argument(
        "--kind",
        default=None,
        choices=["local", "mpi", "connect"],
        help="local (default), mpi (engines are MPI ranks) or connect",
    )
    parser.add_argument("--profile", default=None, help="connect to this running cluster")
    parser.add_argument("--steps", type=int, default=20, help=f"steps per method (1-{MAX_STEPS})")
    parser.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help="comma-separated exchange methods (bulk-synchronous, uncompressed)",
    )
    args = parser.parse_args(argv)
    if args.engines is not None and args.engines < 2:
        parser.error(f"--engines {args.engines}: give 2 or more engines, e.g. --engines 2")
    if not 1 <= args.steps <= MAX_STEPS:
        parser.error(
            f"--steps {args.steps}: give 1 to {MAX_STEPS} (one pass over the "
            f"training digits at a global batch of {BATCH})"
        )
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    known = demo_methods()
    unknown = ", ".join(repr(m) for m in names if m not in known)
    if unknown or not names:
        parser.error(
            f"--methods: {'unknown method ' + unknown if unknown else 'no method'}; give "
            f"comma-separated names from {', '.join(known)}"
        )
    args.methods = list(dict.fromkeys(names))
    return args


def run_demo(args: argparse.Namespace) -> None:
    """Start (or connect to) the engines, print the doctor's report and the methods' table."""
    began = time.perf_counter()
    print(
        f"Connecting to cluster {args.profile!r} ..."
        if args.profile
        else f"Starting {args.engines or 'the'} {args.kind or 'local'} engines ...",
        flush=True,
    )
    from course_lib.cluster import start_cluster
    from course_lib.data.digits import DIGITS_NUM_TEST

    # As `python -m course_lib.demo` this module is __main__, whose functions would travel to the
    # engines by value, without their imports: ship the importable module's functions (by name).
    from course_lib.demo import digits_subset, make_mlp, warm_up
    from course_lib.parallel.data_parallel.reference import train_one_process
    from course_lib.parallel.data_parallel.train import train_data_parallel
    from course_lib.training.loop import TrainConfig

    started = time.perf_counter()
    with start_cluster(args.kind, args.engines, profile=args.profile) as cluster:
        n = cluster.world_size
        print(
            f"Cluster: {n} {cluster.kind} engines ready in {time.perf_counter() - started:.1f}"
            f" s; a trivial call on all of them: {1e3 * round_trip_seconds(cluster):.1f} ms"
            " (median of 30)\n"
        )
        print(cluster.doctor(), "\n", flush=True)
        batch = max(n, BATCH // n * n)
        config = TrainConfig(num_epochs=1, batch_size=batch, **CONFIG)
        dataset = partial(digits_subset, args.steps * batch)
        warming = cluster.view.apply_async(warm_up)  # the engines import torch meanwhile
        t0 = time.perf_counter()
        single = train_one_process(make_mlp, dataset, config)
        print(
            f"MLP 64-128-10 on digits: {args.steps} SGD steps, global batch {batch} "
            f"({batch // n} per engine), lr {config.lr}, momentum {config.momentum}"
        )
        print(
            f"one process (the reference): {time.perf_counter() - t0:.1f} s, test accuracy "
            f"{100 * held_out_accuracy(single):.1f} % on {DIGITS_NUM_TEST} held-out digits\n"
        )
        warming.get(timeout=300)
        width = max(len(m) for m in args.methods)
        head = format_row(None, width)
        print(f"{n} engines, median per step (ms):\n{head}\n{'-' * (len(head) + 6)}", flush=True)
        for method in args.methods:
            t0 = time.perf_counter()
            result = train_data_parallel(
                cluster,
                model=make_mlp,
                dataset=dataset,
                config=config,
                method=method,
                comm_timeout=60,
                timeout=300,
                **OPTIONS.get(method, {}),
            )
            row = {**method_row(result, single), "seconds": time.perf_counter() - t0}
            print(format_row(row, width), flush=True)
        print(f"\n{LEGEND}\nwhole demo: {time.perf_counter() - began:.0f} s")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return 0, or 1 after one line naming the fix when it cannot run."""
    args = parse_args(argv)
    from ipyparallel.error import KernelError  # an engine's error or death

    try:
        run_demo(args)
    except (RuntimeError, ValueError, OSError, KernelError) as exc:  # ClusterError, timeouts, ...
        print(f"kit demo: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the engines were stopped on the way out
        print("kit demo: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # exit through `with`: stop engines
    raise SystemExit(main())
