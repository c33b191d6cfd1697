"""Lecture 13's scoreboard: predicted vs measured step time of every strategy the kit runs, at two link rates.

For each link rate (default 1 Gbit/s and 100 Mbit/s) on 2 engines with gloo: local engines over
the kit's EMULATED link (``course_lib.comm.EmulatedLink``, 50 us), or with ``--room`` two PCs of
the emulated room (real TCP between network namespaces, veth links shaped by ``tc``; needs
root). Alpha and beta are calibrated on the kit's ring at a few sizes (as notebook 13 does);
every operator shard the strategies need is timed *on the engines*, as many at once as its
configuration spans (:class:`~course_lib.cost_model.engine_costs.EngineCosts`, re-timed each
run unless ``--cached-costs``: the machine is shared and its load moves); then every strategy of
:data:`~course_lib.parallel.strategy_runs.ALL_STRATEGIES` (one worker, data parallel, hybrid,
pipeline, attribute split, ZeRO 1-3, ZeRO-2 with 16 KiB and 1 MiB buckets) runs 1 warm-up +
``--steps`` steps of each model (SmallCNN and LeNet) at each batch, and the simulator predicts
it twice: from the engine-timed shards and, for comparison, from shards timed one at a time in
this process (``MeasuredCosts``, cached: the scoreboard's first version). Printed per rate:
every row (both predictions, measured median of the slowest rank, errors, MB sent per step),
median |error| (all rows, and rows sending >= 1 MB a step), Spearman's rank correlation (all
rows, and per model and batch), which strategy each prediction picks and how it fares when
measured; then the what-if (does the best strategy change with the rate, predicted and
measured) and markdown rows, with the machine's load (start, after the shards were timed, end).
ZeRO's measured step includes its optimiser step (SGD, lr 0), which the simulator does not model.

    .venv/bin/python bench/bench_strategy_scoreboard.py                 # ~2 minutes on 2 cores
    .venv/bin/python bench/bench_strategy_scoreboard.py --room          # ~3 minutes, as root
    .venv/bin/python bench/bench_strategy_scoreboard.py --rates 1000 100 --models small_cnn
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.engine_costs import EngineCosts
from course_lib.cost_model.messages import Network
from course_lib.cost_model.op_costs import MeasuredCosts
from course_lib.cost_model.simulator import Simulator
from course_lib.parallel.strategy_runs import (
    ALL_STRATEGIES,
    run_strategy,
    simulator_options,
    strategy_configs,
)
from course_lib.training.operator_graphs import kit_graph

MB = 1e6


def _calibrate() -> tuple[float, float]:
    """Fit alpha, beta of this engine's link on the kit's ring (every engine calls it)."""
    from IPython import get_ipython

    from course_lib.cost_model.alpha_beta import collective_calibration

    comm = get_ipython().user_ns["comm"]
    sizes = [2**18, 2**20, 2**21, 2**22]  # 256 KB .. 4 MB, what a step of SmallCNN sends
    collective_calibration(comm, "ring_allreduce", sizes=sizes, reps=1)  # warm the connections
    fit = collective_calibration(comm, "ring_allreduce", sizes=sizes, reps=5).model
    return fit.alpha, fit.beta


def spearman(a, b) -> float:
    """Return Spearman's rank correlation of ``a`` and ``b`` (no ties expected)."""
    ranks = [np.argsort(np.argsort(v)) for v in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def _cluster(mbit: float, room: bool):
    """Return a context manager of 2 engines: local over the emulated link, or a room's 2 PCs."""
    from course_lib.cluster import start_cluster
    from course_lib.comm import EmulatedLink, setup_communicators

    if room:
        from course_kit.room.cluster import room_cluster

        @contextlib.contextmanager
        def in_room():
            with room_cluster(2, f"{mbit:g}mbit") as cluster:
                setup_communicators(cluster, backend="gloo", timeout=120)
                yield cluster

        return in_room()

    @contextlib.contextmanager
    def local():
        emulated = EmulatedLink(bandwidth=mbit * 1e6 / 8, latency=50e-6)
        with start_cluster("local", 2, torch_threads=1) as cluster:
            setup_communicators(cluster, backend="gloo", link=emulated, timeout=120)
            yield cluster

    return local()


def _cases(models, batches):
    """Yield (model, batch, strategy) of every scoreboard row."""
    for model in models:
        for batch in batches:
            for name in ALL_STRATEGIES:
                if name not in ("hybrid", "attribute") or model != "mlp":  # they split convs
                    yield model, batch, name


def one_rate(
    mbit: float,
    batches,
    steps: int,
    models,
    room: bool,
    cached: bool,
    rounds: int = 1,
    per_row: bool = True,
) -> dict:
    """Calibrate, time the shards on the engines, run and predict every strategy at ``mbit``."""
    solo, rows = MeasuredCosts(repeats=15), []
    for model in models:  # the old way: every shard timed in this process, one at a time
        for batch in batches:
            graph = kit_graph(model, batch)
            for name in ALL_STRATEGIES:
                for op, cfg in zip(graph.ops, strategy_configs(name, graph, 2), strict=True):
                    solo(op, cfg, batch)
    place = f"room {mbit:g} Mbit/s" if room else "local engines"
    engines = EngineCosts(place, repeats=15)
    load_before = os.getloadavg()[0]
    with _cluster(mbit, room) as cluster:
        alpha, beta = cluster.run(_calibrate, timeout=300)[0]
        link = Network(LinkModel(alpha, beta), "nic")
        for model in models:
            for batch in batches:
                graph = kit_graph(model, batch)
                configs = [strategy_configs(name, graph, 2) for name in ALL_STRATEGIES]
                engines.measure(cluster, "comm", graph, configs, refresh=not cached)
        load_timed = os.getloadavg()[0]
        walls: dict[tuple, list[float]] = {}
        sent: dict[tuple, int] = {}  # measured bytes a step (the communicator's counter)
        predicted: dict[tuple, list[float]] = {}  # engine-timed, one per round
        for _ in range(rounds):  # interleaved: every strategy sees the load of the whole run
            for model, batch, name in _cases(models, batches):
                graph, key = kit_graph(model, batch), (model, batch, name)
                configs, options = strategy_configs(name, graph, 2), simulator_options(name)
                if per_row:  # the CPU share of a shared machine moves within seconds
                    engines.measure(cluster, "comm", graph, [configs], refresh=True)
                sim = Simulator(graph, 2, engines, link, **options).run(configs)
                predicted.setdefault(key, []).append(sim.step_time)
                runs = cluster.run(run_strategy, name, "comm", model, batch, steps, timeout=600)
                steps_max = [max(s) for s in zip(*(r["walls"] for r in runs), strict=True)]
                walls.setdefault(key, []).extend(steps_max)
                sent[key] = max(r["bytes_sent"] for r in runs)
        for model, batch, name in _cases(models, batches):
            graph, key = kit_graph(model, batch), (model, batch, name)
            configs, options = strategy_configs(name, graph, 2), simulator_options(name)
            before = Simulator(graph, 2, solo, link, **options).run(configs)
            rows.append({
                "model": model, "strategy": name, "batch": batch,
                "predicted": statistics.median(predicted[key]),
                "predicted_solo": before.step_time,
                "measured": statistics.median(walls[key]),
                "sent": sent[key],
                "sent_predicted": max(before.bytes_sent().values(), default=0.0),
            })  # fmt: skip
    return {
        "mbit": mbit,
        "place": "room (real TCP, tc-shaped veth)" if room else "emulated link",
        "alpha": alpha,
        "beta": beta,
        "rows": rows,
        "load": (load_before, load_timed, os.getloadavg()[0]),
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _figures(rows: list[dict], key: str) -> dict:
    """Return median |error|, its rows >= 1 MB, Spearman and the picks of prediction ``key``."""
    errors = [abs(r[key] - r["measured"]) / r["measured"] for r in rows]
    big = [e for e, r in zip(errors, rows, strict=True) if r["sent"] >= MB]
    out = {
        "median": statistics.median(errors),
        "median_1mb": statistics.median(big) if big else None,
        "rho": spearman([r[key] for r in rows], [r["measured"] for r in rows]),
        "rho_per": {},
        "picks": {},
    }
    for model, batch in sorted({(r["model"], r["batch"]) for r in rows}):
        mine = [r for r in rows if (r["model"], r["batch"]) == (model, batch)]
        pick, best = min(mine, key=lambda r: r[key]), min(mine, key=lambda r: r["measured"])
        slower = (pick["measured"] - best["measured"]) / best["measured"]
        out["picks"][(model, batch)] = (pick["strategy"], best["strategy"], slower)
        ranked = spearman([r[key] for r in mine], [r["measured"] for r in mine])
        out["rho_per"][(model, batch)] = ranked
    return out


def summarise(result: dict) -> dict:
    """Print one rate's rows and return its summary figures (engine-timed and solo-timed)."""
    rows = result["rows"]
    load = " -> ".join(f"{x:.1f}" for x in result["load"])
    print(
        f"\n{result['mbit']:g} Mbit/s, {result['place']}; calibrated alpha "
        f"{result['alpha'] * 1e6:.0f} us, {1 / result['beta'] / MB:.1f} MB/s; load "
        f"(start, shards timed, end) {load}"
    )
    print(
        f"  {'model':9s} {'strategy':13s} {'B':>4s} {'engines':>9s} {'solo':>9s} {'measured':>9s}"
        f" {'error':>6s} {'solo err':>8s} {'MB sent':>8s}"
    )
    for r in rows:
        r["error"] = (r["predicted"] - r["measured"]) / r["measured"]
        r["error_solo"] = (r["predicted_solo"] - r["measured"]) / r["measured"]
        print(
            f"  {r['model']:9s} {r['strategy']:13s} {r['batch']:4d} {r['predicted'] * 1e3:7.1f}ms"
            f" {r['predicted_solo'] * 1e3:7.1f}ms {r['measured'] * 1e3:7.1f}ms {r['error']:+6.0%}"
            f" {r['error_solo']:+8.0%} {r['sent'] / MB:8.2f}"
        )
    out = {"after": _figures(rows, "predicted"), "before": _figures(rows, "predicted_solo")}
    for when, label in (("after", "timed on the engines"), ("before", "timed solo (old)")):
        f = out[when]
        print(
            f"  shards {label}: median |error| {f['median']:.0%} ({len(rows)} rows), rows >= 1 MB "
            f"{_pct(f['median_1mb'])}; Spearman {f['rho']:.2f} (all rows), per model and batch "
            + ", ".join(f"{m} B{b} {v:.2f}" for (m, b), v in f["rho_per"].items())
        )
        for (m, b), (pick, best, slower) in f["picks"].items():
            print(f"    {m} B={b}: picks {pick} (PREDICTED best), measured best {best}; "
                  f"the pick measured {slower:.0%} slower")  # fmt: skip
    return out


def markdown(results: list[dict], summaries: list[dict], steps: int) -> None:
    """Print the rows for docs/measurements.md's lecture 13 section."""
    print("\nmarkdown rows:")
    for res, s in zip(results, summaries, strict=True):
        a, b = s["after"], s["before"]
        picks = "; ".join(
            f"{m} B{bt}: {p}, {x:+.0%} vs {best}" for (m, bt), (p, best, x) in a["picks"].items()
        )
        load = " → ".join(f"{x:.1f}" for x in res["load"])
        print(
            f"| {res['mbit']:g} Mbit/s, {res['place']} (α {res['alpha'] * 1e6:.0f} µs, "
            f"{1 / res['beta'] / MB:.1f} MB/s), load {load} | {len(res['rows'])} | "
            f"{a['median']:.0%} ({_pct(a['median_1mb'])}) | {b['median']:.0%} "
            f"({_pct(b['median_1mb'])}) | {a['rho']:.2f} / {b['rho']:.2f} | {picks} |"
        )


def main() -> None:
    """Run the scoreboard at every rate and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1000.0, 100.0], help="Mbit/s")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved runs of every row")
    parser.add_argument(
        "--time-once",
        action="store_true",
        help="time the shards once per rate, not again right before each row",
    )
    parser.add_argument(
        "--models", nargs="+", default=["small_cnn", "lenet"], choices=["small_cnn", "lenet", "mlp"]
    )
    parser.add_argument("--room", action="store_true", help="2 PCs of the emulated room (root)")
    parser.add_argument(
        "--cached-costs", action="store_true", help="reuse engine-timed shards from the cache"
    )
    parser.add_argument("--store", type=Path, help="write every row as JSON here")
    args = parser.parse_args()
    if args.room:
        from course_kit.room.build import room_unavailable_reason

        reason = room_unavailable_reason()
        if reason:
            raise SystemExit(f"cannot build an emulated room here: {reason}")
    started = time.perf_counter()
    results = []
    for mbit in args.rates:
        results.append(
            one_rate(
                mbit,
                args.batches,
                args.steps,
                args.models,
                args.room,
                args.cached_costs,
                args.rounds,
            )
        )
        if args.store:
            args.store.write_text(json.dumps(results, indent=1))
    summaries = [summarise(r) for r in results]
    if len(results) > 1:
        print("\nwhat-if (best strategy per rate, PREDICTED (engine-timed) / MEASURED):")
        for key in summaries[0]["after"]["picks"]:
            line = ", ".join(
                f"{r['mbit']:g} Mbit/s: {s['after']['picks'][key][0]} / {s['after']['picks'][key][1]}"
                for r, s in zip(results, summaries, strict=True)
            )
            print(f"  {key[0]} B={key[1]}: {line}")
    markdown(results, summaries, args.steps)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
