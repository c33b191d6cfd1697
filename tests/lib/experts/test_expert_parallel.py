"""Expert parallelism on real engines (gloo, 2 and 4 of the shared pool): a mixture of experts
whose experts live on different ranks, tokens dispatched and combined by all-to-all (the
backend's and the pairwise one written from sendrecv), trained 3 Adam steps and compared with
the same MoE trained in one process on the same groups of tokens, dropped tokens included;
and on a 2 x 2 process grid (data x expert): two replicas of the expert-parallel layer.

Tolerance: float32; the expert gradients are summed over ranks in a different order than one
process sums them, rounding only: every weight within 1e-5 relative of one process.
"""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.parallel.experts import MoEConfig, moe_step_bytes, train_moe_one_process

STEPS = 3


@pytest.fixture(scope="module")
def cluster(shared_engines):
    """The session's 4 pooled engines, with gloo ``comm`` and ``comm2`` over ranks 0 and 1."""
    from course_lib.comm import setup_communicators

    cluster = shared_engines(4)
    setup_communicators(cluster, backend="gloo", timeout=30)
    cluster.run(_make_pair, timeout=60)
    return cluster


def _make_pair() -> None:
    from IPython import get_ipython

    from course_lib.parallel.grid import ProcessGrid

    ns = get_ipython().user_ns
    ns["comm2"] = ns["comm"].subgroup([0, 1])
    ns["grid"] = ProcessGrid(ns["comm"], {"data": 2, "expert": 2})


def _train(name: str, cfg, exchange: str) -> dict | None:
    from IPython import get_ipython

    if name == "grid":  # 2 x 2: experts split along "expert", replicas along "data"
        from course_lib.parallel.experts import train_moe_expert_parallel

        grid = get_ipython().user_ns["grid"]
        out = train_moe_expert_parallel(grid["expert"], cfg, STEPS, dp_comm=grid["data"])
        return {**out, "coords": grid.coords}

    from course_lib.collectives import pairwise_all_to_all
    from course_lib.parallel.experts import train_moe_expert_parallel

    comm = get_ipython().user_ns[name]
    if comm is None:
        return None
    fn = pairwise_all_to_all if exchange == "pairwise" else None
    return train_moe_expert_parallel(comm, cfg, STEPS, fn)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "n, exchange, k",
    [(2, "builtin", 2), (4, "pairwise", 2), (4, "builtin", 1), (4, "grid", 2)],
)
def test_expert_parallel_moe_equals_one_process(cluster, n, exchange, k):
    cfg = MoEConfig(num_experts=4, k=k, capacity_factor=1.0, tokens=24)
    where = {"grid": "grid", 4: "comm", 2: "comm2"}[exchange if exchange == "grid" else n]
    results = [r for r in cluster.run(_train, where, cfg, exchange) if r]
    assert len(results) == n
    ref = train_moe_one_process(cfg, n, STEPS)
    # the same tokens dropped, rank by rank and step by step (and some are)
    dropped = np.array([r["dropped"] for r in sorted(results, key=lambda r: r["rank"])]).T
    assert dropped.tolist() == ref["dropped"] and dropped.sum() > 0
    # every weight within 1e-5 relative; each expert from the rank that holds it
    seen = set()
    for res in results:
        for name, w in res["weights"].items():
            want = ref["weights"][name]
            err = np.abs(w - want).max() / np.abs(want).max()
            assert err < 1e-5, (name, res["rank"], err)
            seen.add(name)
    assert seen == set(ref["weights"])
    if exchange == "grid":  # rank r of 4 sits at (data, expert) = divmod(r, 2)
        assert [tuple(r["coords"].values()) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # bytes per rank and step: all-to-alls of (N-1)/N of E*C*d floats: dispatch and combine
    # forward, the combine's backward (the input is data: no dispatch backward)
    cap = -(-cfg.capacity_factor * cfg.k * cfg.tokens // cfg.num_experts)
    ranks = 2 if exchange == "grid" else n  # on the grid the all-to-alls run along "expert"
    want = moe_step_bytes(cfg.num_experts, int(cap), cfg.d_model, ranks, input_needs_grad=False)
    assert all(b == want for r in results for b in r["bytes_sent"]), (
        want,
        results[0]["bytes_sent"],
    )
