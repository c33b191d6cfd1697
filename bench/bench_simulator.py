"""Lecture 13's execution simulator: how fast it predicts, and what it predicts for AlexNet.

1. Strategies simulated per second (full and delta simulation, the kit's SmallCNN on 2 and 4
   workers, operator costs measured on this machine once and cached) beside strategies *run*
   per second: one data-parallel SmallCNN strategy measured on real local gloo engines the way a
   scoreboard would (1 warm-up + ``--repeats`` steps, slowest rank). FlexFlow (source 003)
   reports its simulator about three orders of magnitude faster than running each strategy.
2. Delta vs full simulation time on random one-operator changes.
3. The Metropolis-Hastings search on SmallCNN, 4 workers, the emulated Gigabit link (alpha 50 us,
   117 MB/s): seconds to its best strategy, from data parallelism and from the expert hybrid.
4. Krizhevsky's "one weird trick" (source 004: 1.7x on 2 GPUs, 3.5x on 4, 6.2x on 8) as a
   PREDICTION: AlexNet's graph, 128 images per GPU, per-operator costs from FLOPs at 1.5 TFLOP/s
   per GPU (a K20's 3.5 TFLOP/s peak at about 43 % efficiency, which puts one GPU's step at
   0.37 s, near the paper's 98 h for 90 epochs on one GPU), links of 6 GB/s and 10 us (PCIe
   peer-to-peer), either every pair of GPUs its own link or one shared bus (one transfer at a
   time: GPUs behind one PCIe switch); speed-up of the hybrid and of pure data parallelism,
   with the error against the paper's figures.

    .venv/bin/python bench/bench_simulator.py            # everything (a few minutes on 2 cores)
    .venv/bin/python bench/bench_simulator.py --no-engines  # skip the real-engine run
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.configs import data_parallel, expert_hybrid
from course_lib.cost_model.messages import Network
from course_lib.cost_model.op_costs import FlopsCosts, MeasuredCosts
from course_lib.cost_model.operators import alexnet_layers, build_graph
from course_lib.cost_model.search import mcmc, search_space
from course_lib.cost_model.simulator import Simulator
from course_lib.training.operator_graphs import kit_graph

BATCH = 64
GIGABIT = LinkModel(alpha=50e-6, beta=1 / 117e6)
PAPER = {2: 1.7, 4: 3.5, 8: 6.2}


def _engine_dp_step(repeats: int, batch: int) -> float:
    """Run 1 + ``repeats`` data-parallel SmallCNN steps on this engine; return the wall seconds."""
    import time

    import torch
    from IPython import get_ipython

    from course_lib.training.models import SmallCNN

    comm = get_ipython().user_ns["comm"]
    p, r = comm.world_size, comm.rank
    torch.manual_seed(0)
    net = SmallCNN()
    X, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    t0 = time.perf_counter()
    for _ in range(repeats + 1):
        net.zero_grad()
        shard = slice(r * batch // p, (r + 1) * batch // p)
        torch.nn.functional.cross_entropy(net(X[shard]), y[shard]).backward()
        flat = torch.cat([q.grad.reshape(-1) for q in net.parameters()])
        comm.allreduce(flat)
    comm.barrier()
    return time.perf_counter() - t0


def run_on_engines(p: int, repeats: int) -> float:
    """Return the seconds to measure one strategy on ``p`` real engines (cluster already up)."""
    from course_lib.cluster import start_cluster
    from course_lib.comm import setup_communicators

    with start_cluster("local", p, torch_threads=1) as cluster:
        setup_communicators(cluster, backend="gloo", timeout=60)
        return max(cluster.run(_engine_dp_step, repeats, BATCH, timeout=600))


def sim_speed(p: int, seconds: float = 3.0) -> tuple[float, float, float]:
    """Return (full sims/s, delta sims/s, strategies changed) on SmallCNN over ``p`` workers."""
    graph = kit_graph("small_cnn", BATCH)
    sim = Simulator(graph, p, MeasuredCosts(), GIGABIT)
    space = search_space(sim)
    for i, cands in enumerate(space):  # measure every shard once (cached afterwards)
        for cfg in cands:
            sim.builder.shard_cost(i, cfg)
    rng = random.Random(0)
    strategies, s = [], expert_hybrid(graph, p)
    for _ in range(200):
        i = rng.randrange(len(s))
        s = s[:i] + (rng.choice(space[i]),) + s[i + 1 :]
        strategies.append(s)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        sim.run(strategies[n % len(strategies)])
        n += 1
    full = n / (time.perf_counter() - t0)
    prev, t0, n = sim.run(strategies[0]), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        prev = sim.delta(prev, strategies[1 + n % (len(strategies) - 1)])
        n += 1
    return full, n / (time.perf_counter() - t0), len(strategies)


def search_table(seconds: float) -> None:
    """Print the search's best strategy and seconds to it, SmallCNN on 4 workers."""
    graph = kit_graph("small_cnn", BATCH)
    sim = Simulator(graph, 4, MeasuredCosts(), GIGABIT)
    for name, start in (("data parallel", data_parallel), ("expert hybrid", expert_hybrid)):
        found = mcmc(sim, start(graph, 4), seconds=seconds, seed=0)
        print(
            f"  from {name:14s} {found.start_time * 1e3:8.2f} ms -> best {found.best_time * 1e3:8.2f}"
            f" ms after {found.seconds_to_best:5.2f} s ({found.iterations} proposals, "
            f"{found.accepted} accepted)"
        )
        print(
            "    " + " ".join(f"{op.name}:{c}" for op, c in zip(graph.ops, found.best, strict=True))
        )


def weird_trick_table(topology: str, sync: str) -> None:
    """Print the predicted AlexNet speed-ups (hybrid, pure DP) beside the paper's."""
    link, rate = Network(LinkModel(alpha=10e-6, beta=1 / 6e9), topology), 1.5e12
    base = {}
    print(f"  links: {topology}, gradient sync: {sync}")
    print(
        f"  {'GPUs':>4s} {'hybrid (pred.)':>14s} {'DP (pred.)':>10s} {'paper':>6s} "
        f"{'hybrid err':>10s}"
    )
    for n in (1, 2, 4, 8):
        graph = build_graph("alexnet", (3, 224, 224), alexnet_layers(), 128 * n)
        sim = Simulator(graph, n, FlopsCosts(rate), link, sync)
        t = [sim.run(s(graph, n)).step_time for s in (expert_hybrid, data_parallel)]
        base = base or {k: v for k, v in enumerate(t)}
        hyb, dp = (n * base[k] / t[k] for k in (0, 1))
        paper = PAPER.get(n)
        err = f"{(hyb - paper) / paper:+10.0%}" if paper else f"{'':>10s}"
        print(
            f"  {n:4d} {hyb:14.2f} {dp:10.2f} {paper or 1.0:6.1f} {err}  (hybrid step {t[0]:.3f} s)"
        )


def main() -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="steps per measured strategy")
    parser.add_argument("--search-seconds", type=float, default=20.0)
    parser.add_argument("--no-engines", action="store_true", help="skip the real-engine run")
    args = parser.parse_args()
    print(f"Simulated vs run, SmallCNN batch {BATCH}, emulated Gigabit link:")
    for p in (2, 4):
        full, delta, _ = sim_speed(p)
        row = f"  {p} workers: {full:7.0f} strategies/s simulated, {delta:7.0f}/s delta"
        if not args.no_engines:
            run_s = statistics.median(run_on_engines(p, args.repeats) for _ in range(1))
            row += (
                f"; one strategy on {p} engines: {run_s:.2f} s (1 + {args.repeats} steps) "
                f"-> simulator {full * run_s:,.0f}x faster (delta {delta * run_s:,.0f}x)"
            )
        print(row)
    print(
        f"\nSearch (Metropolis-Hastings, {args.search_seconds:.0f} s budget), SmallCNN, 4 workers:"
    )
    search_table(args.search_seconds)
    print("\nAlexNet, one weird trick: PREDICTED speed-ups (weak scaling, 128 images per GPU):")
    for topology, sync in (
        ("pairs", "per_operator"),
        ("pairs", "after_backward"),
        ("bus", "per_operator"),
        ("bus", "after_backward"),
    ):
        weird_trick_table(topology, sync)


if __name__ == "__main__":
    main()
