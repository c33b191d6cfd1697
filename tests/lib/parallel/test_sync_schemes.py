"""Synchronisation schemes on real engines (gloo): Local-SGD(p), gossip with a rotating partner,
gossip with threshold sparsification (source 001, Algorithms 1-3), replica drift, stragglers.

References: Local-SGD(1) (step, then average the weights) against one process trained on the
whole global batch: averaging the stepped weights, (1/P) sum_j (w - lr v_j), equals stepping
with the averaged gradient up to float32 rounding (the same 2e-5 + 1e-4 relative tolerance as
``tests/test_data_parallel``, >100x the rounding measured there). Local-SGD(p) and gossip against
the single-process simulation of :mod:`course_lib.parallel.data_parallel.reference_local_sgd`, replica by
replica, with the same tolerance (the engines sum in gloo's order, the simulation in row order).
One gossip step against the mixing matrix applied to the stacked vectors (float64: 1e-12).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from torch.utils.data import TensorDataset

from course_lib.collectives.gossip import gossip_partners, next_distance
from course_lib.collectives.mixing import gossip_distances, gossip_matrix
from course_lib.comm.setup import setup_communicators
from course_lib.data.digits import load_digits
from course_lib.parallel.data_parallel.reference import ATOL, RTOL, train_one_process
from course_lib.parallel.data_parallel.reference_local_sgd import simulate_local_sgd
from course_lib.parallel.data_parallel.stragglers import Straggler
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.parallel.exchanges.registry import make_exchange
from course_lib.training.loop import TrainConfig, seed_everything
from course_lib.training.models import MLP

pytestmark = pytest.mark.timeout(600)

CONFIG = TrainConfig(num_epochs=1, batch_size=48, lr=0.3, momentum=0.5, seed=5)
PLAIN = TrainConfig(num_epochs=1, batch_size=48, lr=0.3, seed=5)  # no momentum, as source 001
STEPS = 240 // 48  # steps per epoch
COMM = "sync_test_comm"


def small_digits() -> TensorDataset:
    """The first 240 training digits: 5 global batches of 48 per epoch."""
    X, y = load_digits().tensors
    return TensorDataset(X[:240], y[:240])


def mlp() -> MLP:
    """The digits MLP, narrow (64 -> 32 -> 10: 2410 weights) to keep the tests quick."""
    return MLP(64, (32,))


@pytest.fixture(scope="module")
def cluster(shared_engines):
    return shared_engines(4)  # from the session's pool (tests/conftest.py)


def run(cluster, n: int, config: TrainConfig = CONFIG, **kw):
    return train_data_parallel(
        cluster,
        model=mlp,
        dataset=small_digits,
        config=config,
        world_size=n,
        comm_timeout=30,
        timeout=300,
        **kw,
    )


def close(got: dict, want: dict) -> float:
    """Return the largest difference, after asserting every tensor is within the tolerance."""
    worst = max(float(np.abs(got[k] - want[k]).max()) for k in want)
    assert all(np.allclose(got[k], want[k], atol=ATOL, rtol=RTOL) for k in want), worst
    return worst


def engine_weights(cluster, n: int) -> list[dict]:
    """Every rank's final weights, by rank (the result holds rank 0's only)."""
    return cluster.client[list(cluster.ids_by_rank)[:n]].apply_sync(_weights_here)


def _weights_here() -> dict:
    from IPython import get_ipython

    net = get_ipython().user_ns["_course_dp"]["net"]
    return {k: p.detach().numpy().copy() for k, p in net.named_parameters()}


def _peer_bytes_here() -> dict[int, int]:
    from IPython import get_ipython

    from course_lib.parallel.data_parallel.train import COMM_NAME

    stats = get_ipython().user_ns[COMM_NAME].stats
    return {r: p.bytes_sent for r, p in stats.peers.items()}


def _gossip_here(s: int, threshold: float | None) -> dict:
    """One gossip step (dense, or sparse above ``threshold``) on a vector seeded by the rank."""
    from IPython import get_ipython

    from course_lib.collectives.gossip import gossip_sparse_step, gossip_step

    comm = get_ipython().user_ns[COMM]
    x = np.random.default_rng(comm.rank).standard_normal(50)
    comm.stats.reset()
    y = x.copy()
    if threshold is None:
        gossip_step(comm, y, s)
    else:
        gossip_sparse_step(comm, y, s, threshold)
    sent = {r: p.bytes_sent for r, p in comm.stats.peers.items()}
    return {"x": x, "y": y, "sent": sent}


# ---- Local-SGD (Algorithm 1) -------------------------------------------------------------------


def test_local_sgd_1_equals_bulk_synchronous_training(cluster):
    result = run(cluster, 4, method="local_sgd", period=1)
    worst = close(result.weights, train_one_process(mlp, small_digits, CONFIG))
    assert worst < ATOL and result.max_replica_difference <= 1e-6
    assert all(r["wait_at"][1] > 0 and r["collective_bytes"] > 0 for r in result.records)


@pytest.mark.parametrize("order", ["step_then_average", "average_then_step"])
def test_local_sgd_p_equals_the_simulation_and_waits_only_when_it_averages(cluster, order):
    config, n, p = replace(CONFIG, num_epochs=2), 4, 3
    result = run(
        cluster, n, config, method="local_sgd", period=p, order=order, measure_drift_every=1
    )
    want = simulate_local_sgd(mlp, small_digits, config, n, period=p, order=order)
    for got, expected in zip(engine_weights(cluster, n), want, strict=True):
        close(got, expected)
    nbytes = 4 * sum(w.size for w in result.weights.values())
    for rec in result.records:
        syncs = (rec["step"] + 1) % p == 0
        # Counting facts: a barrier, an allreduce of the weights and a sync phase at every p-th
        # step only; the drift measurement's allreduce (every step) is not counted.
        assert (rec["wait_at"][1] > 0) == syncs and (rec["sync_at"][1] > 0) == syncs, rec["step"]
        assert rec["collective_bytes"] == (nbytes if syncs else 0), rec["step"]
        if order == "step_then_average":  # right after averaging the replicas coincide
            assert (rec["drift"] < 1e-5) == syncs, (rec["step"], rec["drift"])
    steps, drift = result.drift()
    assert list(steps) == list(range(1, 2 * STEPS + 1)) and drift.shape == (2 * STEPS, n)


# ---- gossip (Algorithms 2 and 3) ---------------------------------------------------------------


def test_gossip_partners_rotate_through_half_the_ring_for_every_world_size():
    for p in range(2, 9):
        cycle = list(range(1, p // 2 + 1))
        assert gossip_distances(p, 3 * len(cycle)) == cycle * 3, p
        for s in cycle:
            for i in range(p):
                left, right = gossip_partners(i, p, s)
                assert (left + s) % p == i and (i + s) % p == right
        assert next_distance(p // 2, p) == 1


@pytest.mark.parametrize("n", [3, 4])
def test_one_gossip_step_equals_the_mixing_matrix_and_sparse_sends_only_above_t(cluster, n):
    sub = SimpleNamespace(
        client=cluster.client,
        ids_by_rank=list(cluster.ids_by_rank)[:n],
        engine_info=cluster.engine_info,
    )
    setup_communicators(sub, backend="gloo", name=COMM, timeout=30)
    view = cluster.client[sub.ids_by_rank]
    t = 1.0
    for s in range(1, n // 2 + 1):
        dense = view.apply_sync(_gossip_here, s, None)
        X = np.stack([d["x"] for d in dense])
        np.testing.assert_allclose(
            np.stack([d["y"] for d in dense]), gossip_matrix(n, s) @ X, atol=1e-12
        )
        sparse = view.apply_sync(_gossip_here, s, t)
        hat = np.where(np.abs(X) > t, X, 0.0)
        np.testing.assert_allclose(
            np.stack([d["y"] for d in sparse]), gossip_matrix(n, s) @ hat, atol=1e-12
        )
        for i, d in enumerate(sparse):
            count = int((np.abs(X[i]) > t).sum())
            assert 0 < count < X.shape[1]
            partners = set(gossip_partners(i, n, s))
            # One count (8 bytes) plus an int32 index and a float64 value per component above t.
            assert d["sent"] == {r: 8 + 12 * count for r in partners}, (i, d["sent"])
            assert dense[i]["sent"] == {r: 8 * X.shape[1] for r in partners}


def test_gossip_training_equals_the_simulation_and_talks_to_the_rotating_partners(cluster):
    n = 4
    result = run(cluster, n, PLAIN, method="gossip")  # Algorithm 2: gradients mixed every step
    assert result.flag_bytes == 4 * 4  # a presence flag per tensor rides with the gradient
    nbytes = 4 * 2410 + result.flag_bytes
    for got, expected in zip(
        engine_weights(cluster, n),
        simulate_local_sgd(mlp, small_digits, PLAIN, n, averaging="gossip"),
        strict=True,
    ):
        close(got, expected)
    distances = gossip_distances(n, STEPS)  # 1, 2, 1, 2, 1
    for i, sent in enumerate(
        cluster.client[list(cluster.ids_by_rank)[:n]].apply_sync(_peer_bytes_here)
    ):
        want: dict[int, int] = {}
        for s in distances:
            for peer in set(gossip_partners(i, n, s)):  # s = 2: one partner, one message
                want[peer] = want.get(peer, 0) + nbytes
        assert sent == want, (i, sent, want)
    assert all(r["wait_s"] == 0 for r in result.records)  # never a global barrier
    result = run(cluster, n, PLAIN, method="local_sgd", period=2, averaging="gossip")
    for got, expected in zip(
        engine_weights(cluster, n),
        simulate_local_sgd(mlp, small_digits, PLAIN, n, period=2, averaging="gossip"),
        strict=True,
    ):
        close(got, expected)


def test_sparse_gossip_training_sends_only_the_components_above_t(cluster):
    n, t = 4, 0.01
    partners = [len(set(gossip_partners(0, n, s))) for s in gossip_distances(n, STEPS)]
    result = run(cluster, n, PLAIN, method="gossip_sparse", threshold=t)
    assert all(0 < r["values_sent"] < r["values_total"] == 2410 for r in result.records)
    for rec in result.records:  # to each partner: a count, then int32 indices and float32 values
        sent = rec["values_sent"] + rec["flags_sent"]  # the 4 presence flags, set, always travel
        assert rec["flags_sent"] == 4 and rec["bytes_sent"] == partners[rec["step"]] * (
            8 + 8 * sent
        )
    wide = run(cluster, n, PLAIN, method="gossip_sparse", threshold=1e9)  # no value: flags only
    assert all(r["bytes_sent"] == partners[r["step"]] * (8 + 8 * 4) for r in wide.records)
    seed_everything(PLAIN.seed)  # rank 0's initial network: no value sent, nothing updated
    initial = {k: p.detach().numpy() for k, p in mlp().named_parameters()}
    assert all(np.array_equal(wide.weights[k], w) for k, w in initial.items())


def test_bad_options_are_refused_with_advice():
    with pytest.raises(ValueError, match="period=0: give the number of local steps"):
        make_exchange("local_sgd", period=0)
    with pytest.raises(ValueError, match="choose one of allreduce, gossip, gossip_sparse"):
        make_exchange("local_sgd", averaging="ring")
    with pytest.raises(ValueError, match="threshold=-1: give a number >= 0"):
        make_exchange("gossip_sparse", threshold=-1)


# ---- stragglers ---------------------------------------------------------------------------------


def test_a_straggler_makes_bsp_wait_every_step_and_local_sgd_only_when_it_averages(cluster):
    n, delay, slow = 4, 0.05, 1
    bsp = run(cluster, n, method="local_sgd", period=1, stragglers={slow: Straggler(delay=delay)})
    assert "emulated stragglers: rank 1" in bsp.table()
    assert "emulated stragglers" in bsp.plot_timeline().axes[0].get_title()
    by_step = {}
    for rec in bsp.records:
        by_step.setdefault(rec["step"], {})[rec["rank"]] = rec
    sleeps = others_wait = 0.0
    for recs in by_step.values():
        late = recs[slow]
        assert late["straggler_sleep_s"] >= delay and late["compute_s"] >= delay
        sleeps += late["straggler_sleep_s"]
        for rank, rec in recs.items():
            if rank != slow:  # ordering: nobody leaves the barrier before the straggler arrives
                assert rec["wait_at"][1] >= late["compute_at"][1] - 1e-3
                others_wait += rec["wait_s"]
    assert others_wait >= 0.3 * (n - 1) * sleeps, (others_wait, sleeps)
    local = run(cluster, n, method="local_sgd", period=4, stragglers={slow: Straggler(delay=delay)})
    waited = sorted({r["step"] for r in local.records if r["wait_s"] > 0})
    assert waited == [3]  # 5 steps, averaging after the 4th only
