"""Lecture 15's simulator of a (dp, tp, pp, cp) grid and its search (no engines: the simulator's
step against the pipeline's formula, its bytes against the counted formula, the search's pick
against the shared decision procedure)."""

from __future__ import annotations

import pytest

from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.cost_model.messages import Network
from course_lib.parallel.grid.costs3d import PieceCosts
from course_lib.parallel.grid.equality3d import GRID_SIZES, grid_params, grid_traffic
from course_lib.parallel.grid.search3d import candidate_grids, search_grids
from course_lib.parallel.grid.simulate3d import Grid, predict_grid
from course_lib.parallel.sharded.technique import choose_technique

SAVED = {"embed": 100, "block": 1000, "head": 200}
COSTS = PieceCosts((0.0, 0.0), (1e-3, 2e-3), (0.0, 0.0), SAVED)
FAST = Network(LinkModel(alpha=0.0, beta=1e-15))
SIZES = {**GRID_SIZES, "n_layer": 4}


@pytest.mark.parametrize("pp,m", [(2, 1), (2, 4), (4, 2), (4, 8)])
def test_a_free_link_gives_the_pipelines_bubble_formula(pp, m):
    # 1F1B with balanced stages of forward F and backward B: (m + p - 1)(F + B)
    sim = predict_grid(Grid(pp=pp), SIZES, 8 * m, 8, m, COSTS, FAST)
    per_stage = SIZES["n_layer"] // pp * 3e-3
    assert sim.step_time == pytest.approx((m + pp - 1) * per_stage)


@pytest.mark.parametrize("dims", [(2, 2, 2), (1, 2, 4), (4, 2, 1), (2, 1, 4)])
def test_each_rank_sends_the_wire_bytes_of_the_counted_formula(dims):
    dp, tp, pp = dims
    grid, m = Grid(dp=dp, tp=tp, pp=pp), 2
    sim = predict_grid(grid, SIZES, 16, 8, m, COSTS, FAST)
    sent = sim.bytes_sent()
    named = {"data": dp, "pipeline": pp, "tensor": tp}
    for d in range(dp):
        for s in range(pp):
            for t in range(tp):
                f = grid_traffic(SIZES, 16, 8, named, {"data": d, "pipeline": s, "tensor": t}, m)
                ring = lambda n, b: 2 * (n - 1) / n * b  # noqa: E731 - a ring allreduce's wire bytes
                header = 64 if s < pp - 1 else 0  # the simulator sends no shape header
                want = ring(tp, f["tensor"]["allreduce"][1]) + ring(dp, f["data"]["allreduce"][1])
                want += f["pipeline"]["p2p"][1] - header
                assert sent.get(grid.rank(d, s, 0, t), 0.0) == pytest.approx(want)


def test_the_grids_searched_fill_the_room_and_fit_the_model():
    grids = candidate_grids(8, GRID_SIZES, 16, 8, 2)
    assert Grid(2, 2, 2, 1) in grids and Grid(1, 4, 2, 1) in grids
    assert all(g.world_size == 8 and g.pp <= 2 and g.tp <= 4 for g in grids)
    assert Grid(1, 8, 1, 1) not in grids  # more tensor ranks than heads


def test_the_search_takes_the_fastest_grid_the_decision_procedure_lets_fit():
    rows, best = search_grids(8, GRID_SIZES, 16, 8, 2, 1e9, FAST, lambda g: COSTS)
    assert best is rows[0] and best.fits and best.technique == "DDP"
    assert best.step_seconds == min(r.step_seconds for r in rows)
    # a room too small for every whole replica: the rungs of lecture 11 decide, per grid
    tight = min(r.peak_bytes for r in rows) * 1.01
    rows, best = search_grids(8, GRID_SIZES, 16, 8, 2, tight, FAST, lambda g: COSTS)
    assert best is not None and sum(r.fits for r in rows) < len(rows)
    assert all(best.step_seconds <= r.step_seconds for r in rows if r.fits)
    g = best.grid
    psi = max(
        grid_params(GRID_SIZES, {"data": g.dp, "pipeline": g.pp, "tensor": g.tp},
                    {"pipeline": s, "tensor": t})
        for s in range(g.pp) for t in range(g.tp)
    )  # fmt: skip
    sim = predict_grid(g, GRID_SIZES, 16, 8, 2, COSTS, FAST)
    acts = max(sim.peak_memory()[w] - sim.state_bytes[w] for w in sim.state_bytes)
    layers = GRID_SIZES["n_layer"] // g.pp
    same = choose_technique(psi, g.dp * g.cp, tight, acts, layers=layers, largest_unit=psi / layers)
    assert best.technique == same.technique
    _, none = search_grids(8, GRID_SIZES, 16, 8, 2, 1.0, FAST, lambda g: COSTS)
    assert none is None
