"""Model and pipeline parallelism on local engines: time and bytes per step, and the bubble.

For an MLP on 2 and 4 gloo engines, one training step (batch 64) with
- data parallelism (each engine B/P samples, one allreduce of all gradients),
- tensor parallelism (``TensorParallelMLP``: every engine the whole batch, a split hidden layer),
- pipeline parallelism (GPipe and 1F1B, m = 1, 2, 4, 8 micro-batches, one stage per engine),
prints the median step time (slowest rank), the bytes each engine handed to the network (from the
Communicator's counters) beside the bytes the design predicts, and for the pipelines the measured
bubble beside the formula (p-1)/(m+p-1) and the schedule simulation fed with the measured
per-stage compute times. On a machine with fewer cores than engines the stages take turns on the
cores, so the measured bubble there says more about the machine than about the schedule.

    .venv/bin/python bench/bench_model_parallel.py            # 2 and 4 engines
    .venv/bin/python bench/bench_model_parallel.py --quick    # 2 engines, fewer repeats
"""

from __future__ import annotations

import argparse

from course_lib.cluster import start_cluster
from course_lib.comm import setup_communicators
from course_lib.parallel.pipeline_schedule import Timeline, bubble_formula, simulate

HIDDEN, BATCH, LAYERS = 512, 64, 4  # MLP 64 -> 512 x LAYERS -> 10


def make_model():
    """Return the benchmark's MLP (the same on every engine: seeded)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers, width = [], 64
    for _ in range(LAYERS):
        layers += [nn.Linear(width, HIDDEN), nn.ReLU()]
        width = HIDDEN
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _engine_step(kind: str, repeats: int, m: int = 1, schedule: str = "gpipe") -> dict:
    """Run ``repeats`` steps of ``kind`` on this engine; return median seconds, bytes, timeline."""

    import statistics
    import time

    import numpy as np
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.parallel.pipeline import (
        PipelineSettings,
        even_stages,
        pipeline_step,
        split_stages,
    )
    from course_lib.parallel.tensor_parallel import TensorParallelMLP

    comm = get_ipython().user_ns["comm"]
    p, r = comm.world_size, comm.rank
    model = make_model()
    X, y = torch.randn(BATCH, 64), torch.randint(0, 10, (BATCH,))
    loss_fn = nn.functional.cross_entropy
    if kind == "tensor":
        model = TensorParallelMLP(model, comm)
    if kind == "pipeline":
        model = split_stages(model, even_stages(len(model), p))[r]
        settings = PipelineSettings(schedule, m, BATCH)
    times, timeline = [], None
    for step in range(repeats + 1):  # step 0 warms up connections and allocations
        comm.barrier()
        comm.stats.reset()
        t0 = time.perf_counter()
        model.zero_grad()
        if kind == "data":
            shard = slice(r * BATCH // p, (r + 1) * BATCH // p)
            loss_fn(model(X[shard]), y[shard]).backward()
            flat = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
            comm.allreduce(flat)  # the sum; dividing by p would give the mean
        elif kind == "tensor":
            loss_fn(model(X), y).backward()
        else:
            first, last = r == 0, r == p - 1
            _, timeline = pipeline_step(
                model, comm, settings, X if first else None, y if last else None
            )
        took = np.array([time.perf_counter() - t0])
        sent = comm.stats.bytes_sent + sum(c.bytes for c in comm.stats.collectives.values())
        comm.allreduce(took, op="max")
        if step:
            times.append(float(took[0]))
    params = sum(q.numel() for q in model.parameters())
    return {"seconds": statistics.median(times), "bytes": sent, "params": params,
            "timeline": timeline}  # fmt: skip


def predicted_bytes(kind: str, p: int, rank: int, m: int = 1) -> int:
    """Return the bytes rank ``rank`` hands to the network in one step, by design."""
    params = sum(q.numel() for q in make_model().parameters())
    if kind == "data":
        return 4 * params  # one allreduce buffer of every gradient
    if kind == "tensor":  # Linear j: column-parallel for even j, row-parallel for odd j
        ins, outs = [64] + [HIDDEN] * LAYERS, [HIDDEN] * LAYERS + [10]
        floats = 0
        for j in range(LAYERS + 1):
            if j % 2:  # row-parallel: allreduce of the output, forward
                floats += BATCH * outs[j]
            else:
                floats += BATCH * ins[j] if j else 0  # dL/dX allreduce, unless X is data
                if j == LAYERS:  # an odd last layer: column-parallel, gathered (padded shard)
                    floats += BATCH * -(-outs[j] // p)
        return 4 * floats
    act = 4 * BATCH * HIDDEN  # every stage boundary here carries B x HIDDEN floats
    sends = (rank < p - 1) + (rank > 0)  # activations forward, gradients back
    return sends * act + (64 if rank < p - 1 else 0)  # + the shape header, once per step


def main() -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 engines, 3 repeats")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    print("Simulated bubble, balanced stages (backward = 2 x forward), vs (p-1)/(m+p-1):")
    for p in (2, 4):
        row = [f"m={m}: {simulate('1f1b', [1] * p, m).bubble_fraction:.3f}"
               f"/{bubble_formula(p, m):.3f}" for m in (1, 2, 4, 8, 16)]  # fmt: skip
        print(f"  p={p}  " + "  ".join(row))
    for p in (2,) if args.quick else (2, 4):
        with start_cluster("local", p, torch_threads=1) as cluster:
            setup_communicators(cluster, backend="gloo", timeout=60)
            # functions of this script run on the engines with the engines' globals: send ours
            constants = {"HIDDEN": HIDDEN, "BATCH": BATCH, "LAYERS": LAYERS}
            cluster.view.push({"make_model": make_model, **constants})
            print(f"\n{p} engines (gloo, loopback), MLP 64-{HIDDEN}x{LAYERS}-10, batch {BATCH}:")
            print(f"  {'strategy':22s} {'step ms':>8s} {'bytes/rank (max)':>17s} "
                  f"{'predicted':>10s} {'bubble':>7s} {'formula':>8s} {'simulated':>9s}")  # fmt: skip
            runs = [("data", 1, ""), ("tensor", 1, "")]
            runs += [("pipeline", m, s) for s in ("gpipe", "1f1b") for m in (1, 2, 4, 8)]
            for kind, m, sched in runs:
                res = cluster.run(_engine_step, kind, repeats, m, sched or "gpipe", timeout=600)
                sent = max(r["bytes"] for r in res)
                pred = max(predicted_bytes(kind, p, r, m) for r in range(p))
                label = kind if kind != "pipeline" else f"{sched} m={m}"
                extra = ""
                if kind == "pipeline":
                    t = Timeline.merge([r["timeline"] for r in res])
                    f = [sum(iv.end - iv.start for iv in t.intervals
                             if iv.stage == s and iv.kind == "F") / m for s in range(p)]  # fmt: skip
                    b = [sum(iv.end - iv.start for iv in t.intervals
                             if iv.stage == s and iv.kind == "B") / m for s in range(p)]  # fmt: skip
                    sim = simulate(sched, f, m, backward_costs=b).bubble_fraction
                    extra = f" {t.bubble_fraction:7.1%} {bubble_formula(p, m):8.1%} {sim:9.1%}"
                print(f"  {label:22s} {res[0]['seconds'] * 1e3:8.2f} {sent:17d} {pred:10d}{extra}")


if __name__ == "__main__":
    main()
