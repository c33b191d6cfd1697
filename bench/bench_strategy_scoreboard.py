"""Lecture 13's scoreboard: predicted vs measured step time of every strategy the kit runs, at two link rates.

For each emulated link rate (default 1 Gbit/s and 100 Mbit/s, 50 us, gloo on 2 local engines;
EMULATED, as ``course_lib.comm.EmulatedLink`` says), alpha and beta are calibrated on the kit's
ring at a few sizes (as notebook 13 does), then every strategy of
:mod:`course_lib.parallel.strategy_runs` (one worker, data parallel, hybrid, pipeline, ZeRO 1-3)
runs 1 warm-up + ``--steps`` steps of SmallCNN at each batch, and the simulator predicts it from
operator costs measured once on this machine (``MeasuredCosts``, cached) and the calibrated link
(``nic`` topology, gradients summed after backward; ZeRO's own passes). Printed per rate: every
row (predicted, measured median of the slowest rank, error, MB sent per step), the median
|error| (all rows, and rows sending >= 1 MB a step), Spearman's rank correlation, which strategy
the simulator picks and how it fares when measured; then the what-if (does the best strategy
change with the rate, predicted and measured) and markdown rows for docs/measurements.md, with
the machine's load beside them. ZeRO's measured step includes its optimiser step (SGD, lr 0:
a few hundred microseconds here), which the simulator does not model.

    .venv/bin/python bench/bench_strategy_scoreboard.py                 # ~3 minutes on 2 cores
    .venv/bin/python bench/bench_strategy_scoreboard.py --rates 1000 100 --batches 64 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.messages import Network
from course_lib.cost_model.op_costs import MeasuredCosts
from course_lib.cost_model.simulator import Simulator
from course_lib.parallel.strategy_runs import (
    STRATEGIES,
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


def one_rate(mbit: float, batches, steps: int, model: str) -> dict:
    """Calibrate, run and predict every strategy on an emulated link of ``mbit`` Mbit/s."""
    from course_lib.cluster import start_cluster
    from course_lib.comm import EmulatedLink, setup_communicators

    emulated = EmulatedLink(bandwidth=mbit * 1e6 / 8, latency=50e-6)
    costs, rows = MeasuredCosts(repeats=15), []
    for batch in batches:  # time every shard before the engines start (cached for later runs)
        graph = kit_graph(model, batch)
        for name in STRATEGIES:
            for op, cfg in zip(graph.ops, strategy_configs(name, graph, 2), strict=True):
                costs(op, cfg, batch)
    load_before = os.getloadavg()[0]
    with start_cluster("local", 2, torch_threads=1) as cluster:
        setup_communicators(cluster, backend="gloo", link=emulated, timeout=120)
        alpha, beta = cluster.run(_calibrate, timeout=300)[0]
        link = Network(LinkModel(alpha, beta), "nic")
        for batch in batches:
            graph = kit_graph(model, batch)
            for name in STRATEGIES:
                sim = Simulator(graph, 2, costs, link, **simulator_options(name))
                predicted = sim.run(strategy_configs(name, graph, 2))
                runs = cluster.run(run_strategy, name, "comm", model, batch, steps, timeout=600)
                steps_max = [max(s) for s in zip(*(r["walls"] for r in runs), strict=True)]
                rows.append({
                    "strategy": name, "batch": batch,
                    "predicted": predicted.step_time, "measured": statistics.median(steps_max),
                    "sent": max(r["bytes_sent"] for r in runs),
                    "sent_predicted": max(predicted.bytes_sent().values(), default=0.0),
                })  # fmt: skip
    return {
        "mbit": mbit,
        "alpha": alpha,
        "beta": beta,
        "rows": rows,
        "load": (load_before, os.getloadavg()[0]),
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def summarise(result: dict) -> dict:
    """Print one rate's rows and return its summary figures."""
    rows = result["rows"]
    print(
        f"\n{result['mbit']:g} Mbit/s emulated link; calibrated alpha "
        f"{result['alpha'] * 1e6:.0f} us, {1 / result['beta'] / MB:.1f} MB/s; load "
        f"{result['load'][0]:.1f} -> {result['load'][1]:.1f}"
    )
    print(
        f"  {'strategy':14s} {'B':>4s} {'predicted':>10s} {'measured':>9s} {'error':>7s} {'MB sent':>8s}"
    )
    for r in rows:
        r["error"] = (r["predicted"] - r["measured"]) / r["measured"]
        print(
            f"  {r['strategy']:14s} {r['batch']:4d} {r['predicted'] * 1e3:8.1f}ms "
            f"{r['measured'] * 1e3:7.1f}ms {r['error']:+7.0%} {r['sent'] / MB:8.2f}"
        )
    errors = [abs(r["error"]) for r in rows]
    big = [abs(r["error"]) for r in rows if r["sent"] >= MB]
    rho = spearman([r["predicted"] for r in rows], [r["measured"] for r in rows])
    out = {
        "median": statistics.median(errors),
        "median_1mb": statistics.median(big) if big else None,
    }
    out["rho"], out["picks"] = rho, {}
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        pick, best = min(mine, key=lambda r: r["predicted"]), min(mine, key=lambda r: r["measured"])
        slower = (pick["measured"] - best["measured"]) / best["measured"]
        out["picks"][batch] = (pick["strategy"], best["strategy"], slower)
        print(f"  B={batch}: picks {pick['strategy']} (PREDICTED best), measured best "
              f"{best['strategy']}; the pick measured {slower:.0%} slower than the best")  # fmt: skip
    print(
        f"  median |error| {out['median']:.0%} ({len(rows)} rows); rows sending >= 1 MB: "
        f"{_pct(out['median_1mb'])} ({len(big)} rows); Spearman {rho:.2f}"
    )
    return out


def markdown(results: list[dict], summaries: list[dict], steps: int) -> None:
    """Print the rows for docs/measurements.md's lecture 13 section."""
    print("\nmarkdown rows:")
    for res, s in zip(results, summaries, strict=True):
        cells = "; ".join(
            f"{r['strategy']} B{r['batch']} {r['predicted'] * 1e3:.1f}/{r['measured'] * 1e3:.1f} "
            f"({r['error']:+.0%})"
            for r in res["rows"]
        )
        picks = "; ".join(
            f"B={b}: pick {p} (measured best {m}, pick {x:+.0%})"
            for b, (p, m, x) in s["picks"].items()
        )
        print(
            f"| SmallCNN on 2 engines, {res['mbit']:g} Mbit/s emulated link (alpha "
            f"{res['alpha'] * 1e6:.0f} us, {1 / res['beta'] / MB:.1f} MB/s calibrated), "
            f"{len(res['rows'])} strategies, 1 + {steps} steps, load {res['load'][0]:.1f} -> "
            f"{res['load'][1]:.1f} | predicted/measured ms (error): {cells}. Median |error| "
            f"{s['median']:.0%}, >= 1 MB rows {_pct(s['median_1mb'])}, Spearman {s['rho']:.2f}; "
            f"{picks} | `.venv/bin/python bench/bench_strategy_scoreboard.py` |"
        )


def main() -> None:
    """Run the scoreboard at every rate and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1000.0, 100.0], help="Mbit/s")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--store", type=Path, help="write every row as JSON here")
    args = parser.parse_args()
    started = time.perf_counter()
    results = [one_rate(m, args.batches, args.steps, args.model) for m in args.rates]
    summaries = [summarise(r) for r in results]
    if len(results) > 1:
        print("\nwhat-if (best strategy per rate, PREDICTED / MEASURED):")
        for batch in args.batches:
            line = ", ".join(
                f"{r['mbit']:g} Mbit/s: {s['picks'][batch][0]} / {s['picks'][batch][1]}"
                for r, s in zip(results, summaries, strict=True)
            )
            print(f"  B={batch}: {line}")
    markdown(results, summaries, args.steps)
    if args.store:
        args.store.write_text(json.dumps(results, indent=1))
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
