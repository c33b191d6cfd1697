"""Lecture 11's bridge run on the engines: PyTorch's ZeroRedundancyOptimizer and FSDP2 train the
same model on the same batches as the kit's zero1 and zero3, to the same weights, each rank
holding only part of Adam's state (torch's optimiser shards whole tensors, FSDP2 slices each)."""

from __future__ import annotations

import pytest
from test_sharded import ADAM, relative_error, small_digits, uneven_mlp

from course_lib.parallel.data_parallel.train import train_data_parallel
from course_lib.parallel.sharded.bridge import train_torch_sharded

pytestmark = pytest.mark.timeout(600)

N, PSI = 2, 1375  # uneven_mlp: 1 375 trainable values


@pytest.mark.parametrize(("kind", "stage"), [("zero_redundancy", 1), ("fsdp2", 3)])
def test_torchs_sharding_trains_like_the_kits_stage(shared_engines, kind, stage):
    cluster = shared_engines(N)
    kit = train_data_parallel(
        cluster,
        model=uneven_mlp,
        dataset=small_digits,
        config=ADAM,
        method=f"zero{stage}",
        comm_timeout=30,
        timeout=300,
    )  # also leaves gloo's process group on the engines
    ranks = cluster.run(train_torch_sharded, kind, uneven_mlp, small_digits, ADAM, timeout=300)
    assert relative_error(ranks[0]["weights"], ranks[1]["weights"]) == 0.0
    assert relative_error(ranks[0]["weights"], kit.weights) <= 1e-6
    state = [r["optimizer_bytes"] for r in ranks]
    assert sum(state) >= 8 * PSI and max(state) < 8 * PSI  # Adam's m and v, sharded
    if stage == 3:
        assert max(r["param_bytes"] for r in ranks) < 4 * PSI  # FSDP2 shards the weights too


def test_the_bridge_refuses_an_unknown_kind_and_a_missing_process_group():
    with pytest.raises(RuntimeError, match="setup_communicators"):
        train_torch_sharded("fsdp2", uneven_mlp, small_digits, ADAM)
