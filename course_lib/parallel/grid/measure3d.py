"""Lecture 15: 3D steps measured on the engines beside the simulator's prediction for the same grids.

:func:`measure_grids` runs on every engine (shipped by reference; the communicator found in the
engine's namespace by name): it builds each grid over the same ranks (data, pipeline, tensor),
times one training step of each in interleaved rounds (:func:`course_lib.timing.interleaved_rounds`,
a barrier before and after each step so every rank times the whole step), measures the pieces'
costs at each grid's shapes while the other engines do the same (the load a step sees), and
calibrates the link: time per byte by ping-pong, latency as a 2-rank allreduce of every pair at
once shows it (all engines busy, as in a step), less what a call costs on a line of one rank
(the communicator's own work, which the simulator charges to the caller). What a step does outside the pipeline (the
optimiser's step, two barriers) is measured too and added to the simulated step.
:func:`prediction_rows` turns rank 0's numbers and every rank's times into one row per grid:
measured spread (slowest rank per round), prediction, error.
"""

from __future__ import annotations

from typing import Any

__all__ = ["measure_grids", "prediction_rows"]


def measure_grids(
    comm_name: str,
    grids: list[tuple[int, int, int]],
    sizes: dict,
    batch: int,
    length: int,
    num_microbatches: int = 2,
    rounds: int = 5,
) -> dict[str, Any]:
    """Return this rank's step times per grid (``(dp, tp, pp)``), and the costs and link fit.

    Every rank calls it with the same arguments.
    """
    import torch
    from IPython import get_ipython

    from course_lib.cost_model.alpha_beta import ping_pong
    from course_lib.parallel.grid.costs3d import measure_piece_costs
    from course_lib.parallel.grid.gpt3d import GridStage, grid_train_step
    from course_lib.parallel.grid.mesh import ProcessGrid
    from course_lib.parallel.pipeline_parallel.pipeline import PipelineSettings
    from course_lib.timing import interleaved_rounds
    from course_lib.training.transformer import TinyGPT

    comm = get_ipython().user_ns[comm_name]
    torch.manual_seed(0)
    X = torch.randint(0, sizes["vocab"], (batch, length))
    ref = TinyGPT(**sizes)
    candidates, fixed = {}, {}
    for dp, tp, pp in grids:
        grid = ProcessGrid(comm, {"data": dp, "pipeline": pp, "tensor": tp})
        stage = GridStage(ref, grid)
        opt = torch.optim.Adam(stage.parameters(), lr=1e-3)
        share = slice(grid.coords["data"] * batch // dp, (grid.coords["data"] + 1) * batch // dp)
        settings = PipelineSettings("1f1b", num_microbatches, batch // dp)

        def step(stage=stage, grid=grid, opt=opt, share=share, settings=settings) -> None:
            comm.barrier()
            opt.zero_grad()
            grid_train_step(stage, grid, settings, X[share], X[share])
            opt.step()
            comm.barrier()

        def outside(opt=opt) -> None:  # what a step does besides the pipeline: not simulated
            comm.barrier()
            opt.zero_grad()
            opt.step()
            comm.barrier()

        label = f"dp{dp} tp{tp} pp{pp} cp1"
        candidates[label], fixed[label] = step, outside
    spreads = interleaved_rounds(candidates, rounds=rounds, warmup=1)
    outside = interleaved_rounds(fixed, rounds=rounds, warmup=1)
    costs = {
        f"dp{dp} tp{tp} pp{pp} cp1": measure_piece_costs(
            sizes, batch // (dp * num_microbatches), length, tp
        )
        for dp, tp, pp in grids
    }
    beta = ping_pong(comm, sizes=[2**k for k in range(6, 17, 2)], repeats=5).model.beta
    # a message's latency as the step's collectives see it: every pair at once, all engines busy
    pairs = ProcessGrid(comm, {"rest": comm.world_size // 2, "pair": 2})["pair"]
    alone = ProcessGrid(comm, {"rest": comm.world_size, "one": 1})["one"]
    small = torch.zeros(16)
    calls = interleaved_rounds(
        {"pair": lambda: pairs.allreduce(small), "alone": lambda: alone.allreduce(small)},
        rounds=21,
    )
    call = calls["alone"].median  # the communicator's own work: no byte leaves the rank
    return {
        "times": {k: list(v.samples) for k, v in spreads.items()},
        "outside": {k: v.median for k, v in outside.items()},
        "call": call,
        "link": (max(calls["pair"].median - call, 1e-6) / 2, beta),  # 2-rank ring: 2 messages
        "costs": costs,
    }


def prediction_rows(
    per_rank: list[dict],
    sizes: dict,
    batch: int,
    length: int,
    num_microbatches: int = 2,
    engines_per_core: float = 1.0,
) -> list[dict]:
    """Return per grid: the measured spread (slowest rank each round), the prediction, the error.

    ``engines_per_core`` > 1 (more engines than cores) stretches every piece by that factor:
    the simulator gives each rank a processor of its own, the machine does not.
    """
    from course_lib.cost_model.alpha_beta import LinkModel
    from course_lib.cost_model.messages import Network
    from course_lib.parallel.grid.simulate3d import Grid, predict_grid
    from course_lib.timing import Spread

    head = per_rank[0]
    link = Network(LinkModel(*head["link"]))
    rows = []
    for label, _ in head["times"].items():
        slowest = [max(r["times"][label][k] for r in per_rank) for k in range(len(_))]
        dp, tp, pp, cp = (int(part[2:]) for part in label.split())
        grid = Grid(dp, tp, pp, cp)
        sim = predict_grid(grid, sizes, batch, length, num_microbatches, head["costs"][label], link,
                           compute_scale=max(1.0, engines_per_core),
                           call_seconds=head["call"])  # fmt: skip
        predicted = sim.step_time + max(r["outside"][label] for r in per_rank)
        measured = Spread.of(slowest)
        rows.append(
            {
                "grid": label,
                "measured": measured,
                "predicted": predicted,
                "simulated": sim.step_time,
                "error": (predicted - measured.median) / measured.median,
            }
        )
    return rows
