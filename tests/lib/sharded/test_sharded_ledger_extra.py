"""Lecture 11's memory ledger beyond the model state: activations (the same saved-tensor hook
as :func:`activation_memory`), the exchange's own communication buffers, and the process's
resident memory beside them.

One run per stage (0-3; stage 3 also with ``prefetch=False``, key ``"3 inline"``) of 2 steps
of Adam on 2 engines, the model and data of ``tests/lib/sharded/test_sharded.py`` (1 375 trainable values in
units of 975, 240 and 160).
"""

from __future__ import annotations

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from course_lib.data.digits import load_digits
from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.parallel.sharded import Zero3
from course_lib.parallel.sharded.activations import activation_memory
from course_lib.parallel.sharded.ledger import EXTRA_KEYS, LEDGER_KEYS, Ledger, rss_bytes
from course_lib.parallel.sharded.units import unit_sizes
from course_lib.training.loop import TrainConfig

pytestmark = pytest.mark.timeout(600)

N, GLOBAL_BATCH, PSI = 2, 48, 1375
ADAM = TrainConfig(num_epochs=1, batch_size=GLOBAL_BATCH, lr=3e-3, optimizer="adam", seed=7)


def small_digits() -> TensorDataset:
    """The first 96 training digits: 2 global batches of 48."""
    X, y = load_digits().tensors
    return TensorDataset(X[:96], y[:96])


def uneven_mlp() -> nn.Module:
    """64-15-15-10: 1 375 trainable values in three modules of 975, 240 and 160."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 15), nn.ReLU(), nn.Linear(15, 15), nn.ReLU(), nn.Linear(15, 10)
    )


@pytest.fixture(scope="module")
def records(shared_engines):
    """``{stage: every rank's step records}``, one run per stage (and stage 3 not prefetching)."""
    pool = shared_engines(N)
    methods = {stage: f"zero{stage}" for stage in range(4)}
    methods["3 inline"] = Zero3(1024, prefetch=False)
    return {
        stage: train_data_parallel(
            pool,
            model=uneven_mlp,
            dataset=small_digits,
            config=ADAM,
            method=method,
            world_size=N,
            comm_timeout=30,
            timeout=300,
            **({"bucket_bytes": 1024} if isinstance(method, str) else {}),
        ).records
        for stage, method in methods.items()
    }


def one_rank_batch() -> torch.Tensor:
    """A batch of one rank's size, in a storage of its own (as the data loader makes it)."""
    return load_digits().tensors[0][: GLOBAL_BATCH // N].clone()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_activation_bytes_are_what_activation_memory_measures(records, stage):
    want = activation_memory(uneven_mlp(), one_rank_batch())
    assert want.saved_bytes == 4 * (GLOBAL_BATCH // N) * (64 + 15 + 15)
    assert len(records[stage]) == 2 * N
    for rec in records[stage]:
        assert rec["ledger_activation_bytes"] == want.saved_bytes, rec["rank"]


@pytest.mark.parametrize("stage", [0, 1, 2, "3 inline"])
def test_comm_buffer_bytes_are_the_largest_flat_buffer(records, stage):
    # Stages 0-1 flatten every gradient into one buffer; stage 2 one bucket, stage 3 without
    # prefetching one unit at a time (its gradients to reduce-scatter, or the ring's receive
    # buffer for its weights).
    want = 4 * max(unit_sizes(uneven_mlp(), int(str(stage)[0]), N, bucket_bytes=1024))
    assert want == {0: 4 * PSI, 1: 4 * PSI, "3 inline": 4 * 975}.get(stage, want)
    for rec in records[stage]:
        assert rec["ledger_comm_bytes"] == want, rec["rank"]


def test_prefetching_stage_3_holds_at_most_one_comm_buffer_per_unit(records):
    # Queued, not waited for: the next unit's receive buffer and the gradients of units whose
    # reduce-scatter has not run yet are held together. Never two buffers of one unit (its
    # gradients exist only after its backward allgather landed): at most every unit's values
    # once; at least the largest unit's (each step samples its allgather's buffer).
    for rec in records[3]:
        assert 4 * 975 <= rec["ledger_comm_bytes"] <= 4 * PSI, rec["rank"]


@pytest.mark.parametrize("stage", [0, 1, 2, 3, "3 inline"])
def test_resident_memory_holds_everything_counted(records, stage):
    for rec in records[stage]:
        counted = rec["ledger_in_flight_bytes"] + sum(
            rec[k] for k in ("ledger_activation_bytes", "ledger_comm_bytes")
        )
        assert rec["ledger_rss_bytes"] >= counted
        assert rec["ledger_rss_bytes"] >= 50e6  # an interpreter with torch loaded, at least


def test_rss_is_the_resident_memory_in_bytes():
    # psutil reads the same counter; a few MB may come and go between the two readings.
    assert abs(rss_bytes() - psutil.Process().memory_info().rss) <= 8e6


def test_views_of_parameters_or_gradients_are_not_comm_buffers():
    flat = torch.zeros(100)
    p = nn.Parameter(flat[:60].view(6, 10))
    p.grad = torch.zeros(6, 10)
    ledger = Ledger([p], [])
    own = torch.zeros(25)
    ledger.sample(settled=True, buffers=[flat[60:], p.grad.view(-1), own, own[5:]])
    out = ledger.close()
    assert out["ledger_comm_bytes"] == 4 * 25
    assert set(EXTRA_KEYS) <= set(out) and sum(out[k] for k in LEDGER_KEYS) == 400 + 240


def test_a_watched_forward_records_what_activation_memory_measures():
    net, x = uneven_mlp(), one_rank_batch()
    ledger = Ledger(list(net.parameters()), [])
    handles = ledger.watch_forward(net)
    net(x).sum().backward()
    with torch.no_grad():  # evaluation saves nothing and does not lower the step's peak
        net(x)
    for handle in handles:
        handle.remove()
    assert ledger.close()["ledger_activation_bytes"] == activation_memory(net, x).saved_bytes
