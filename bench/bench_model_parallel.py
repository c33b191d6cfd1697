"""Model and pipeline parallelism on local engines: time and bytes per step, and the bubble.

For an MLP on 2 and 4 gloo engines, one training step (batch 64) with
- data parallelism (each engine B/P samples, one allreduce of all gradients),
- tensor parallelism (``TensorParallelMLP``: every engine the whole batch, a split hidden layer),
- pipeline parallelism (GPipe and 1F1B, m = 1, 2, 4, 8 micro-batches, one stage per engine),
prints the median step time (slowest rank), the bytes each engine handed to the network (from the
Communicator's counters) beside the bytes the design predicts, and for the pipelines the measured
bubble beside the formula (p-1)/(m+p-1) and the schedule simulation fed with the measured
per-stage compute times. Then, for the course's ``SmallCNN`` (batch 64), Krizhevsky's hybrid
(``course_lib.parallel.model_parallel.hybrid``: data-parallel convolutions, model-parallel dense layers) beside
data parallelism, the tensor-parallel dense head and a 1F1B pipeline: every collective there
goes round the kit's ring from point-to-point messages, so the bytes are bytes sent (mean over
ranks, beside the cost model). Communication time is shown twice: inside the step (it includes
waiting for the slowest rank's compute) and for the same collectives run alone after a barrier,
the latter beside the alpha-beta prediction from a timed ring allreduce on the same engines
(cost_model.alpha_beta.collective_calibration; a ping-pong fit was 2-4.7x off on loopback). On a loaded machine the times say more about the load. On a machine with fewer cores than engines the stages take turns on the
cores, so the measured bubble there says more about the machine than about the schedule.

    .venv/bin/python bench/bench_model_parallel.py            # 2 and 4 engines
    .venv/bin/python bench/bench_model_parallel.py --quick    # 2 engines, fewer repeats
    .venv/bin/python bench/bench_model_parallel.py --only cnn # the CNN's table (the hybrid)
"""

from __future__ import annotations

import argparse

from course_lib.cluster import start_cluster
from course_lib.comm import setup_communicators
from course_lib.cost_model.alpha_beta import LinkModel, predict
from course_lib.parallel.model_parallel.hybrid import (
    data_parallel_bytes,
    hybrid_bytes,
    hybrid_collectives,
    layer_sizes,
)
from course_lib.parallel.pipeline_parallel.schedule import Timeline, bubble_formula, simulate

HIDDEN, BATCH, LAYERS = 512, 64, 4  # MLP 64 -> 512 x LAYERS -> 10
CNN_BATCH = 64  # SmallCNN on 3 x 32 x 32 images


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

    from course_lib.parallel.model_parallel.tensor_parallel import TensorParallelMLP
    from course_lib.parallel.pipeline_parallel.pipeline import (
        PipelineSettings,
        even_stages,
        pipeline_step,
        split_stages,
    )

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
    return {
        "seconds": statistics.median(times),
        "bytes": sent,
        "params": params,
        "timeline": timeline,
    }


def _engine_cnn_step(kind: str, repeats: int) -> dict:
    """Run ``repeats`` SmallCNN steps of ``kind``; return median step and communication seconds."""
    import statistics
    import time

    import numpy as np
    import torch
    from IPython import get_ipython
    from torch import nn

    from course_lib.collectives.ring import ring_allreduce
    from course_lib.parallel.model_parallel.hybrid import (
        HybridCNN,
        RingCollectives,
        hybrid_step,
        shard_batch,
    )
    from course_lib.parallel.model_parallel.tensor_parallel import TensorParallelMLP
    from course_lib.parallel.pipeline_parallel.pipeline import (
        PipelineSettings,
        even_stages,
        pipeline_step,
        split_stages,
    )
    from course_lib.training.models import SmallCNN

    comm = get_ipython().user_ns["comm"]
    p, r = comm.world_size, comm.rank
    torch.manual_seed(0)
    model, ring = SmallCNN(), RingCollectives(comm)
    X, y = torch.randn(CNN_BATCH, 3, 32, 32), torch.randint(0, 10, (CNN_BATCH,))
    loss_fn = nn.functional.cross_entropy
    if kind == "tensor":  # every engine the whole batch, the dense head split
        model = TensorParallelMLP(model, ring)
    elif kind == "hybrid":
        model = HybridCNN(model, comm)
    elif kind == "pipeline":  # a plain Sequential: slicing SmallCNN would call SmallCNN(dict)
        model = split_stages(nn.Sequential(*model), even_stages(len(model), p))[r]
    times, comm_times = [], []
    for step in range(repeats + 1):  # step 0 warms up connections and allocations
        comm.barrier()
        comm.stats.reset()
        ring.seconds, comm_s = 0.0, 0.0
        t0 = time.perf_counter()
        model.zero_grad()
        if kind == "data":
            X_shard, y_shard = shard_batch(X, y, comm)  # each engine B/N samples
            loss_fn(model(X_shard), y_shard).backward()
            flat = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
            c0 = time.perf_counter()
            ring_allreduce(comm, flat)  # the sum; dividing by p would give the mean
            comm_s = time.perf_counter() - c0
        elif kind == "tensor":
            loss_fn(model(X), y).backward()
            comm_s = ring.seconds
        elif kind == "hybrid":
            comm_s = sum(hybrid_step(model, *shard_batch(X, y, comm)).seconds.values())
        else:
            settings = PipelineSettings("1f1b", 4, CNN_BATCH)
            pipeline_step(model, comm, settings, X if r == 0 else None, y if r == p - 1 else None)
        took = np.array([time.perf_counter() - t0, comm_s])
        sent = comm.stats.bytes_sent
        comm.allreduce(took, op="max")
        if step:
            times.append(float(took[0]))
            comm_times.append(float(took[1]))
    return {
        "seconds": statistics.median(times),
        "comm": statistics.median(comm_times),
        "bytes": sent,
    }


def cnn_predictions(kind: str, p: int) -> tuple[float, list | None]:
    """Return (bytes per rank, mean over ranks; the step's collectives [(algorithm, bytes)])."""
    from torch import nn

    from course_lib.parallel.pipeline_parallel.pipeline import even_stages
    from course_lib.training.models import SmallCNN

    net = SmallCNN()
    conv, widths = layer_sizes(net)
    calls = hybrid_collectives(CNN_BATCH, p, conv, widths)
    if kind == "data":
        params = sum(q.numel() for q in net.parameters())
        return data_parallel_bytes(params, p), [("ring_allreduce", 4 * params)]
    if kind == "hybrid":
        flat = [c for part in calls.values() for c in part]
        return sum(hybrid_bytes(CNN_BATCH, p, conv, widths).values()), flat
    if kind == "tensor":  # the head's collectives, plus dL/d(features) allreduced (f)
        head = hybrid_bytes(CNN_BATCH, p, conv, widths)["dense head"]
        features = ("ring_allreduce", 4 * CNN_BATCH * widths[0])
        return head + 2 * (p - 1) / p * features[1], calls["dense head"] + [features]
    # pipeline: each boundary's activations forward (+ a 64-byte shape header), gradients back
    import torch

    x, sizes, layers = torch.zeros(1, 3, 32, 32), [], list(net)
    for a, b in even_stages(len(net), p)[:-1]:
        x = nn.Sequential(*layers[a:b])(x)
        sizes.append(x.numel())
    return sum(2 * 4 * CNN_BATCH * n + 64 for n in sizes) / p, None


def _time_collectives(calls: list, repeats: int) -> float:
    """Return the median seconds (slowest rank) of ``calls`` [(algorithm, bytes)] run alone."""
    import statistics
    import time

    import numpy as np
    from IPython import get_ipython

    from course_lib.collectives import ring

    comm = get_ipython().user_ns["comm"]
    bufs = [(getattr(ring, alg), np.zeros(n // 4, np.float32)) for alg, n in calls]
    times = []
    for step in range(repeats + 1):
        comm.barrier()  # alone: nobody waits for a slower rank's compute
        t0 = time.perf_counter()
        for fn, buf in bufs:
            fn(comm, buf)
        took = np.array([time.perf_counter() - t0])
        comm.allreduce(took, op="max")
        if step:
            times.append(float(took[0]))
    return statistics.median(times)


def cnn_table(cluster, p: int, repeats: int) -> None:
    """Print the SmallCNN rows: data, tensor head, hybrid, pipeline on ``p`` engines."""
    link = cluster.run(_calibrate, timeout=300)[0]
    print(
        f"\n{p} engines, SmallCNN, batch {CNN_BATCH}; link fitted by the timed ring allreduce: alpha "
        f"{link.alpha * 1e6:.0f} us, {link.bandwidth / 1e9:.2f} GB/s, "
        f"gamma {link.gamma * 1e9:.2f} ns/B"
    )
    print(
        f"  {'strategy':9s} {'step ms':>8s} {'bytes/rank':>11s} {'predicted':>10s} {'err':>5s} "
        f"{'comm+wait ms':>12s} {'comm alone':>10s} {'predicted':>9s} {'err':>6s}"
    )
    for kind in ("data", "tensor", "hybrid", "pipeline"):
        res = cluster.run(_engine_cnn_step, kind, repeats, timeout=600)
        sent = sum(r["bytes"] for r in res) / p
        pred_bytes, calls = cnn_predictions(kind, p)
        row = (
            f"  {kind:9s} {res[0]['seconds'] * 1e3:8.1f} {sent:11.0f} {pred_bytes:10.0f} "
            f"{(sent - pred_bytes) / pred_bytes:5.1%}"
        )
        if calls is not None:
            alone = cluster.run(_time_collectives, calls, repeats, timeout=600)[0]
            pred_s = sum(predict(alg, n, p, link) for alg, n in calls)
            row += (
                f" {res[0]['comm'] * 1e3:12.2f} {alone * 1e3:10.2f} {pred_s * 1e3:9.2f} "
                f"{(alone - pred_s) / pred_s:6.0%}"
            )
        else:
            row += f" {'(sends overlap compute)':>40s}"
        print(row)


def _calibrate() -> LinkModel:
    from IPython import get_ipython

    from course_lib.cost_model import (
        alpha_beta as cost_model,  # a module: this function runs on the engines
    )

    comm = get_ipython().user_ns["comm"]
    # The collective's own fit, not a ping-pong: one idle pair is not what a ring step sees
    # (cost_model.collective_calibration); its beta already holds the reduction arithmetic.
    return cost_model.collective_calibration(
        comm, "ring_allreduce", sizes=[2**18, 2**20, 2**22]
    ).model


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
    parser.add_argument("--only", choices=("mlp", "cnn"), help="one table: the MLP's or the CNN's")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    print("Simulated bubble, balanced stages (backward = 2 x forward), vs (p-1)/(m+p-1):")
    for p in (2, 4):
        row = [
            f"m={m}: {simulate('1f1b', [1] * p, m).bubble_fraction:.3f}/{bubble_formula(p, m):.3f}"
            for m in (1, 2, 4, 8, 16)
        ]
        print(f"  p={p}  " + "  ".join(row))
    for p in (2,) if args.quick else (2, 4):
        with start_cluster("local", p, torch_threads=1) as cluster:
            setup_communicators(cluster, backend="gloo", timeout=60)
            # functions of this script run on the engines with the engines' globals: send ours
            constants = {"HIDDEN": HIDDEN, "BATCH": BATCH, "LAYERS": LAYERS, "CNN_BATCH": CNN_BATCH}
            cluster.view.push({"make_model": make_model, **constants})
            if args.only != "cnn":
                mlp_table(cluster, p, repeats)
            if args.only != "mlp":
                cnn_table(cluster, p, repeats)


def mlp_table(cluster, p: int, repeats: int) -> None:
    """Print the MLP rows: data, tensor, GPipe and 1F1B (m = 1, 2, 4, 8) on ``p`` engines."""
    print(f"\n{p} engines (gloo, loopback), MLP 64-{HIDDEN}x{LAYERS}-10, batch {BATCH}:")
    print(
        f"  {'strategy':22s} {'step ms':>8s} {'bytes/rank (max)':>17s} "
        f"{'predicted':>10s} {'bubble':>7s} {'formula':>8s} {'simulated':>9s}"
    )
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
            f = [
                sum(iv.end - iv.start for iv in t.intervals if iv.stage == s and iv.kind == "F") / m
                for s in range(p)
            ]
            b = [
                sum(iv.end - iv.start for iv in t.intervals if iv.stage == s and iv.kind == "B") / m
                for s in range(p)
            ]
            sim = simulate(sched, f, m, backward_costs=b).bubble_fraction
            extra = f" {t.bubble_fraction:7.1%} {bubble_formula(p, m):8.1%} {sim:9.1%}"
        print(f"  {label:22s} {res[0]['seconds'] * 1e3:8.2f} {sent:17d} {pred:10d}{extra}")


if __name__ == "__main__":
    main()
