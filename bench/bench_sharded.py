"""Benchmark lecture 11's ZeRO stages against data parallelism on the emulated Gigabit link.

Trains an MLP on digits (64-1024-1024-10: 1.13 M parameters, 4.5 MB of float32 gradients) with
Adam for a few steps on 4 local engines over gloo, the link emulated as Gigabit (125 MB/s,
50 us), with PyTorch DDP (``ddp``), ``zero0`` (the kit's ring allreduce, every rank the whole
state), ``zero1``, ``zero2``, ``zero3/inline`` (stage 3 waiting for each collective where it is
issued: ``Zero3(prefetch=False)``), ``zero3`` (the registered stage 3: the next module's
allgather prefetched, reduce-scatters queued, all on one communication thread, every pass in
whole ring chunks), ``zero3/seg`` (a large unit's passes in 512 KiB segments, pipelined:
``Zero3(segment_bytes=SEGMENT_BYTES)``) and ``zero3/wrap`` (segments and FSDP's size-based
wrapping policy, ``Zero3(min_unit=100_000)``: the two small layers join the root's unit,
gathered once per step), ``zero3/wrap/keep`` (the same with ``keep_last=True``: the 1024 x 1024
layer, the last module forward runs outside the root, stays gathered into backward, which needs
it first, as torchtitan keeps its last block: two passes instead of three), ``zero0/whole``
(the kit's ring in whole chunks, ``Zero0(segment_bytes=None)``; ``zero0`` sends its 1.1 MB
chunks in 1 MiB segments, pipelined) and ``zero0/nowait`` (``zero0`` without the barrier the kit
times as ``wait`` before the exchange; DDP has none). Prints per method the median step and its parts, the step as a ratio
to DDP's and to ``zero0``'s, the bytes each rank sent per step against the auditor's formula,
and the model-state bytes per rank from the ledger against the formula, then how busy stage 3's
communication thread was. The issue's aim for stage 3 is <= 1.3x DDP's step.

What the step records' events (each collective's issue, start and end on the thread) show:
the thread is busy nearly the whole step, and compute is a few ms of it. On one link the bytes
set a floor: stage 3 sends 10.14 MB a rank (81 ms at 125 MB/s) where DDP sends 6.76 MB, and the
1024x1024 layer (93 % of them) cannot compute before its last byte has come, so its three passes
(allgather for forward, again for backward, reduce-scatter) follow each other on the thread
whatever is prefetched; splitting that unit would only add messages. What was recovered is
time the thread spent not sending: six of the nine collectives move small units (1 % and 6 % of
the bytes) and each costs a round of the slowest rank's turn on a core (5-15 ms each on the
loaded 2 cores, for under 2 ms of link time); ``zero3/wrap`` makes them two (the root's unit,
gathered at forward, reduce-scattered at the end). The large unit's ring steps each waited
for a neighbour's whole chunk; in segments the next step's first segment is on its way while
the last ones of this step travel, and the reductions run while data moves. Two queues
(allgathers apart from reduce-scatters, as FSDP's two streams) were tried and lost here: the
emulated card sends one message at a time, so a small pass queued behind 1 MB messages waits
for them. ``--batch`` (samples per engine) adds compute for the transfers to hide behind.
``--rounds R`` runs the methods in turn R times and takes the median of the rounds' medians;
``--methods`` times only those named (and DDP).
All local engines share this PC's cores: on 2 cores the compute is slowed by contention, and
so is the communication thread when it overlaps compute.

``--fit MB`` measures instead the largest model each scheme trains on the engines when a rank
may hold at most MB megabytes of model state (the ledger's in-flight peak: parameters,
gradients, Adam state, the stage-3 units gathered at once: the current module's and the next
one's, prefetched; not activations): a deep MLP (``--depth`` hidden layers, so that no one
stage-3 unit is a large share) is run 2 steps at a small width to measure each scheme's bytes
per parameter, the width that fits is derived from it, then
run 2 steps (Adam's state exists from the first step on) and narrowed until the ledger's peak is
under the limit. ``--room`` times the methods in an emulated room instead (root): one engine
per network namespace, real TCP over 1 Gbit/s shaped links, as ``bench_data_parallel.py --room``.

    .venv/bin/python bench/bench_sharded.py            # 4 engines, 8 steps
    .venv/bin/python bench/bench_sharded.py --engines 2 --steps 6 --rounds 3
    .venv/bin/python bench/bench_sharded.py --rounds 3 --batch 64 --steps 5
    .venv/bin/python bench/bench_sharded.py --rounds 5 --methods zero3 zero3/seg zero3/wrap
    .venv/bin/python bench/bench_sharded.py --fit 64   # 64 MB of model state per engine
    .venv/bin/python bench/bench_sharded.py --room     # the emulated room (root)
"""

from __future__ import annotations

import argparse
import os
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
from course_lib.parallel.sharded.fsdp_unit import SEGMENT_BYTES  # noqa: E402
from course_lib.parallel.sharded.ledger import formula_bytes  # noqa: E402
from course_lib.parallel.sharded.units import root_unit, unit_sizes  # noqa: E402
from course_lib.training.loop import TrainConfig  # noqa: E402
from course_lib.training.models import MLP  # noqa: E402

#: label -> (method, its options): stage 3 without and with prefetching, and wrapped
METHODS = {
    "ddp": ("ddp", {}),
    "zero0": ("zero0", {}),
    "zero0/whole": ("zero0", {"segment_bytes": None}),
    "zero0/nowait": ("zero0", {"measure_wait": False}),
    "zero1": ("zero1", {}),
    "zero2": ("zero2", {}),
    "zero3/inline": ("zero3", {"prefetch": False}),
    "zero3": ("zero3", {"prefetch": True}),
    "zero3/seg": ("zero3", {"prefetch": True, "segment_bytes": SEGMENT_BYTES}),
    "zero3/wrap": (
        "zero3",
        {"prefetch": True, "min_unit": 100_000, "segment_bytes": SEGMENT_BYTES},
    ),
    "zero3/wrap/keep": (
        "zero3",
        {"min_unit": 100_000, "segment_bytes": SEGMENT_BYTES, "keep_last": True},
    ),
}
FIT_METHODS = {"zero0": "DDP (zero0)", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
HIDDEN = (1024, 1024)
BUCKET_BYTES = 1 << 20


def run(cluster, method: str, model, batch: int, steps: int, link=GIGABIT, **options):
    """Train ``model`` ``steps`` steps of ``batch`` samples with ``method`` (``link=None``: as is)."""
    measure_wait = options.pop("measure_wait", True)  # False: no barrier timed before the ring
    options = {"bucket_bytes": BUCKET_BYTES, **options} if method.startswith("zero") else {}
    config = TrainConfig(num_epochs=1, batch_size=batch, lr=1e-3, optimizer="adam", seed=0)
    return train_data_parallel(
        cluster,
        model=model,
        dataset=partial(digits_subset, batch * steps),
        config=config,
        method=method,
        link=link,
        comm_timeout=120,
        timeout=900,
        measure_wait=measure_wait,
        **options,
    )


def step_times(
    cluster,
    n: int,
    steps: int,
    rounds: int,
    room: bool = False,
    per_engine: int = 16,
    methods: list[str] | None = None,
) -> None:
    """Run ``methods`` (default all; ``ddp`` always) ``rounds`` times in turn on the emulated
    link (or the room); print them."""
    chosen = {m: METHODS[m] for m in METHODS if m == "ddp" or methods is None or m in methods}
    batch = per_engine * n
    model = partial(MLP, 64, HIDDEN)
    psi = sum(p.numel() for p in model().parameters())
    print(
        f"MLP 64-{'-'.join(map(str, HIDDEN))}-10, {psi:,} parameters, {n} engines, Adam, "
        f"global batch {batch}, {steps} steps, "
        f"{'the emulated room (real TCP, 1 Gbit/s tbf links)' if room else 'emulated Gigabit'}, "
        f"median of {rounds} round(s); load average {os.getloadavg()[0]:.1f}"
    )
    head = (
        f"{'method':>18} {'step ms':>8} {'comm ms':>8} {'sync ms':>8} {'x ddp':>6} {'x zero0':>8} "
    )
    print(head + f"{'sent MB':>8} {'formula':>8} {'state MB':>9} {'formula':>8}  rounds' ms")
    medians: dict[str, list[tuple[float, float, float]]] = {m: [] for m in chosen}
    last = {}
    for _ in range(rounds):
        for method, (name, options) in chosen.items():
            link = None if room else GIGABIT
            result = run(cluster, name, model, batch, steps, link, **options)
            rows = result.summary()
            medians[method].append(
                tuple(
                    statistics.median(r[k] for r in rows) for k in ("total_s", "comm_s", "sync_s")
                )
            )
            last[method] = result
    step = {m: statistics.median(t[0] for t in medians[m]) for m in chosen}
    zero0 = step.get("zero0", float("nan"))
    for method in chosen:
        comm = statistics.median(t[1] for t in medians[method])
        sync = statistics.median(t[2] for t in medians[method])
        result, rows = last[method], last[method].summary()
        sent = statistics.median(r["bytes_sent"] for r in rows) / 1e6
        line = f"{method:>18} {1e3 * step[method]:>8.1f} {1e3 * comm:>8.1f} {1e3 * sync:>8.1f} "
        line += f"{step[method] / step['ddp']:>6.2f} {step[method] / zero0:>8.2f} "
        line += f"{sent:>8.2f} " if method != "ddp" else f"{'(gloo)':>8} "  # not counted p2p
        if method.startswith("zero"):
            stage, least = int(method[4]), METHODS[method][1].get("min_unit", 0)
            units = unit_sizes(model(), stage, n, BUCKET_BYTES, least)
            root = root_unit(model(), stage, least)
            kept = len(units) - 1 if METHODS[method][1].get("keep_last") else None
            audit = audit_bytes(result.records, stage, units, n, root=root, kept=kept)
            formula = statistics.median(r["formula"] for r in audit) / 1e6
            late = [r for r in result.records if r["step"] >= 1]
            held = max(r["ledger_settled_bytes"] for r in late) / 1e6
            line += f"{formula:>8.2f} {held:>9.2f} {formula_bytes(stage, psi, n) / 1e6:>8.2f}"
            line += "" if all(r["ok"] for r in audit) else "  BYTES DIFFER FROM THE AUDITOR"
        else:
            line += " " * 27
        rounds_ms = [1e3 * t[0] for t in medians[method]]
        print(line + f"  {min(rounds_ms):.0f}-{max(rounds_ms):.0f}", flush=True)
    for method in chosen:  # where the step's time goes, the last round's medians
        rows = last[method].summary()
        parts = ", ".join(
            f"{p} {1e3 * statistics.median(r[f'{p}_s'] for r in rows):.1f}"
            for p in ("compute", "wait", "comm", "step", "sync")
        )
        print(f"{method}: last round's phases (ms, median over ranks): {parts}")
    for method in (m for m in chosen if m.startswith("zero3")):
        late = [r for r in last[method].records if r["step"] >= 1]
        peak = max(r["ledger_in_flight_bytes"] for r in late) / 1e6
        print(
            f"{method}: its communication thread busy {thread_busy(last[method]):.0%} of the step;"
            f" the ledger's in-flight peak {peak:.2f} MB a rank"
        )


def thread_busy(result) -> float:
    """Return the median over steps (from step 1) and ranks of stage 3's communication thread's
    busy share of the step: its jobs' run times (the step's events) over the step's time."""
    shares = [
        sum(e["end_at"] - e["start_at"] for e in r["events"] if "end_at" in e) / r["total_s"]
        for r in result.records
        if r["step"] >= 1
    ]
    return statistics.median(shares)


def ledger_peak(cluster, method: str, width: int, depth: int, n: int) -> tuple[int, float]:
    """Return (parameters, the largest in-flight ledger bytes of any rank over 2 steps)."""
    model = partial(MLP, 64, (width,) * depth)
    psi = sum(p.numel() for p in model().parameters())
    result = run(cluster, method, model, 4 * n, 2)
    return psi, max(r["ledger_in_flight_bytes"] for r in result.records)


def largest_fit(cluster, n: int, limit_mb: float, depth: int) -> None:
    """Print the largest MLP each scheme trains within ``limit_mb`` MB of model state per rank."""
    limit = limit_mb * 1e6
    print(
        f"largest MLP 64-(w x {depth})-10 each scheme trains on {n} engines with at most "
        f"{limit_mb:g} MB of model state per engine (ledger, in-flight peak; Adam, float32)"
    )
    print(f"{'scheme':>12} {'B/param':>8} {'width':>6} {'params':>11} {'peak MB':>8} {'x DDP':>6}")
    base = None

    def widest(per_param: float) -> int:
        # the MLP's parameters: (depth - 1) w^2 + (depth + 74) w + 10 (biases included)
        a, b = depth - 1, depth + 74
        return int((-b + (b * b + 4 * a * (limit / per_param - 10)) ** 0.5) / (2 * a))

    for method, label in FIT_METHODS.items():
        probe_psi, probe_peak = ledger_peak(cluster, method, 64, depth, n)
        first = probe_peak / probe_psi
        width, tries = widest(first), 0
        while True:  # bytes per parameter change a little with the width: refine, then verify
            psi, peak = ledger_peak(cluster, method, width, depth, n)
            better, tries = widest(peak / psi), tries + 1
            if peak <= limit and (better <= width * 1.01 or tries >= 4):
                break
            width = min(better, width - 1) if peak > limit else better
        base = base or psi
        print(
            f"{label:>12} {peak / psi:>8.2f} {width:>6} {psi:>11,} {peak / 1e6:>8.2f} "
            f"{psi / base:>6.2f}",
            flush=True,
        )


def main() -> None:
    """Parse the options; time the methods, or find the largest model each fits."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--rounds", type=int, default=1, help="run the methods in turn this many times"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=16,
        help="samples per engine per step (more: more compute for communication to hide behind)",
    )
    parser.add_argument(
        "--fit",
        type=float,
        metavar="MB",
        default=None,
        help="instead: the largest MLP each scheme trains with at most MB of model state per engine",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        default=None,
        help="time only these (ddp always, the ratios' base); default: all",
    )
    parser.add_argument("--depth", type=int, default=16, help="--fit's MLP's hidden layers")
    parser.add_argument(
        "--room",
        action="store_true",
        help="time the methods in an emulated room instead: one engine per PC, real TCP over "
        "1 Gbit/s shaped links (root, ip, tc, unshare)",
    )
    args = parser.parse_args()
    if args.fit is None and args.batch * args.engines * args.steps > 1500:
        parser.error(
            "--batch x --engines x --steps must be at most 1500 (the digits' training set)"
        )
    if args.room:
        from course_kit.room.cluster import room_cluster

        try:
            with room_cluster(args.engines, rate="1gbit") as cluster:
                step_times(
                    cluster, args.engines, args.steps, args.rounds, True, args.batch, args.methods
                )
        except RuntimeError as exc:
            raise SystemExit(f"--room: {exc}") from None
        return
    with start_cluster("local", args.engines) as cluster:
        if args.fit is None:
            step_times(
                cluster, args.engines, args.steps, args.rounds, False, args.batch, args.methods
            )
        else:
            largest_fit(cluster, args.engines, args.fit, args.depth)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
