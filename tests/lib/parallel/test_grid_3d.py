"""TinyGPT trained in 3D on 8 real engines (gloo): a data 2 x pipeline 2 x tensor 2 process grid,
each parallelism's collectives on its axis's sub-communicator, equal to one process.

Per rank: the last stage's forward logits and the first step's gradients (relative 1e-5) and every local weight after 3 Adam
steps (1e-5 of the largest weight, float32) against the same part of one TinyGPT trained on the
whole batch; the first step's calls and bytes counted by each axis's communicator equal
``grid_traffic``; the model state held (weights, gradients, Adam's moments) equals
``grid_state_bytes``. The 8 engines are this module's own (the shared pool has 4): one start,
one training run, every test reads its rows.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(400)
DIMS = {"data": 2, "pipeline": 2, "tensor": 2}
RTOL = 1e-5


def _train_on_grid() -> dict:
    from IPython import get_ipython

    from course_lib.parallel.grid import ProcessGrid
    from course_lib.parallel.grid.equality3d import compare_grid_with_one_process

    ns = get_ipython().user_ns
    grid = ProcessGrid(ns["comm"], {"data": 2, "pipeline": 2, "tensor": 2})
    return compare_grid_with_one_process(grid)


@pytest.fixture(scope="module")
def rows():
    """Every rank's comparison row from one 3D training run on 8 engines of this module's own."""
    from course_lib.cluster import start_cluster
    from course_lib.comm import setup_communicators

    with start_cluster("local", 8) as cluster:
        setup_communicators(cluster, backend="gloo", timeout=60)
        yield cluster.run(_train_on_grid, timeout=300)


def test_the_grid_trains_tinygpt_equal_to_one_process(rows):
    ends = [r for r in rows if r["forward"] is not None]
    assert len(ends) == 4  # the last stage of each replica, on each tensor rank
    assert all(r["coords"]["pipeline"] == 1 for r in ends)
    for r in rows:
        assert r["forward"] is None or r["forward"] < RTOL, r
        # Adam hides a gradient's scale (the data axis's mean): the first gradients themselves
        assert max(r["grads"].values()) < RTOL, (r["coords"], r["grads"])
        assert r["weights"] < RTOL, (r["coords"], r["worst"], r["weights"])


def test_each_axis_counts_the_bytes_of_its_formula(rows):
    for r in rows:
        assert r["counted"] == r["formula"], r["coords"]
    # the axes carry different traffic: no axis's bytes leaked into another's counter
    first = next(r for r in rows if r["coords"] == {"data": 0, "pipeline": 0, "tensor": 0})
    assert first["counted"]["pipeline"]["p2p"][1] > 0
    assert first["counted"]["tensor"]["allreduce"][0] == 2 * (4 + 1)


def test_each_rank_holds_the_model_state_of_its_formula(rows):
    for r in rows:
        assert r["state"] == r["state_formula"], r["coords"]
    stages = {r["coords"]["pipeline"]: r["state"] for r in rows if r["coords"]["tensor"] == 0}
    assert stages[0] != stages[1]  # the embedding's stage and the head's differ
