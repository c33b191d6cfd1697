"""An exchange method is one object (lecture 4's seam): what the kit knows about a method lives on
its class, an instance defined in a notebook trains on the engines with no registration, and a
parameter that no rank has a gradient for is left alone, as one process leaves it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from course_lib.data.digits import load_digits
from course_lib.demo import demo_methods
from course_lib.parallel.data_parallel.checkpointing import (
    checkpointable_methods,
    prepare_checkpointing,
)
from course_lib.parallel.data_parallel.prediction import predict_step
from course_lib.parallel.data_parallel.reference import (
    max_weight_difference,
    train_one_process,
    weights_match,
)
from course_lib.parallel.data_parallel.reference_local_sgd import simulate_local_sgd
from course_lib.parallel.data_parallel.train import DataParallelError, train_data_parallel
from course_lib.parallel.exchanges.base import GradientExchange
from course_lib.parallel.exchanges.buckets import BucketedAllreduce
from course_lib.parallel.exchanges.registry import EXCHANGES, make_exchange
from course_lib.training.loop import TrainConfig

pytestmark = pytest.mark.timeout(600)

CONFIG = TrainConfig(num_epochs=1, batch_size=48, lr=0.3, momentum=0.9, seed=5)

#: A cell of a student's notebook: a method written as a GradientExchange subclass, 20 lines.
NOTEBOOK_CELL = '''
import numpy as np
from course_lib.parallel.exchanges.base import FlatExchange

class SumInRankOrder(FlatExchange):
    """Gather every rank's buffer with point-to-point messages and add them in rank order."""

    name = "sum_in_rank_order"

    def average(self, comm, flat):
        others = [peer for peer in range(comm.world_size) if peer != comm.rank]
        parts = {peer: np.empty_like(flat) for peer in others}
        handles = [comm.irecv(parts[peer], src=peer) for peer in others]
        handles += [comm.isend(flat, dst=peer) for peer in others]
        for handle in handles:
            handle.wait()
        parts[comm.rank] = flat.copy()
        flat[:] = np.sum([parts[r] for r in range(comm.world_size)], axis=0) / comm.world_size
'''


def notebook_class() -> type[GradientExchange]:
    """Return the class of :data:`NOTEBOOK_CELL`, defined in a ``__main__`` as a notebook's is."""
    namespace = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<notebook cell>", "exec"), namespace)  # noqa: S102
    return namespace["SumInRankOrder"]


def small_digits() -> TensorDataset:
    """The first 192 training digits: 4 global batches of 48."""
    X, y = load_digits().tensors
    return TensorDataset(X[:192], y[:192])


class SkipsABranch(nn.Module):
    """A branch used on even steps only, on every rank alike (stochastic depth, made regular).

    On odd steps no rank has a gradient for ``branch``: one process leaves it alone, while a zero
    gradient would let momentum keep moving it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.branch, self.out = nn.Linear(64, 16), nn.Linear(16, 16), nn.Linear(16, 10)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x.flatten(1)))
        if self.training:
            self.calls += 1
            if self.calls % 2 == 1:  # steps 0, 2, 4, ... (counted from 0) use the branch
                h = h + torch.relu(self.branch(h))
        return self.out(h)


@pytest.fixture(scope="module")
def cluster(shared_engines):
    return shared_engines(4)  # from the session's pool (tests/conftest.py)


def test_a_notebook_method_trains_on_four_engines_as_an_object_with_no_registration(cluster):
    cls = notebook_class()
    assert cls.__module__ == "__main__" and cls.name not in EXCHANGES
    result = train_data_parallel(
        cluster,
        model="mlp",
        dataset=small_digits,
        config=CONFIG,
        method=cls(),
        comm_timeout=30,
        timeout=300,
    )
    assert result.method == "sum_in_rank_order" and result.world_size == 4
    assert result.replicas_equal
    reference = train_one_process("mlp", small_digits, CONFIG)
    assert weights_match(result.weights, reference), max_weight_difference(
        result.weights, reference
    )
    # Registered nowhere: not in this process's table, nor in any engine's.
    tables = cluster.client[cluster.ids_by_rank].apply_sync(_engine_exchange_names)
    assert all("sum_in_rank_order" not in names for names in tables)
    # Point-to-point only: each rank sent its buffer (values and flags) to 3 peers.
    assert {rec["bytes_sent"] for rec in result.records} == {
        3 * (result.gradient_bytes + result.flag_bytes)
    }


def _engine_exchange_names() -> list[str]:
    from course_lib.parallel.exchanges.registry import EXCHANGES

    return list(EXCHANGES)


def test_an_instance_with_options_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="pass options to the exchange's constructor"):
        make_exchange(BucketedAllreduce(), bucket_bytes=64)


#: Every way a presence flag travels: a flat buffer, buckets, DDP's own map, a compressed
#: allreduce, compressed frames (gathered, or through a server), DDP's compression hook, gossip
#: (dense, and sparse with the flags always sent). Lossless settings, so one process is the answer
#: (the mixing simulation for gossip, whose replicas are not averaged).
NO_GRADIENT_CASES = {
    "ring": ("ring", {}),
    "parameter_server": ("parameter_server", {}),
    "bucketed": ("bucketed", {"bucket_bytes": 256}),
    "ddp": ("ddp", {"find_unused_parameters": True}),
    "compressed-allreduce": ("compressed", {"compressor": "none"}),
    "compressed-allgather": (
        "compressed",
        {"compressor": "none", "carrier": "allgather", "codec": "zlib"},
    ),
    "compressed-server": ("compressed", {"compressor": "none", "carrier": "parameter_server"}),
    "ddp_compressed": ("ddp_compressed", {"compressor": "none", "find_unused_parameters": True}),
    "gossip": ("gossip", {}),
    "gossip_sparse": ("gossip_sparse", {"threshold": 0.0}),  # every nonzero: dense gossip's mix
}


@pytest.mark.parametrize("case", list(NO_GRADIENT_CASES))
def test_a_parameter_no_rank_has_a_gradient_for_is_left_alone(cluster, case):
    method, options = NO_GRADIENT_CASES[case]
    result = train_data_parallel(
        cluster,
        model=SkipsABranch,
        dataset=small_digits,
        config=CONFIG,
        method=method,
        world_size=4,
        comm_timeout=30,
        timeout=300,
        **options,
    )
    if EXCHANGES[method].averages_every_step:
        reference = train_one_process(SkipsABranch, small_digits, CONFIG)
        assert result.replicas_equal
    else:  # gossip: rank 0's replica, mixed with its partners' by the matrices of source 001
        reference = simulate_local_sgd(SkipsABranch, small_digits, CONFIG, 4, averaging="gossip")[0]
    worst = max(
        float(np.abs(result.weights[k] - reference[k]).max())
        for k in reference
        if k.startswith("branch")
    )
    assert worst < 1e-5, f"{case}: the skipped branch moved {worst:.2e} away from its reference"
    assert weights_match(result.weights, reference), max_weight_difference(
        result.weights, reference
    )


def test_ddp_without_find_unused_parameters_names_the_switch(cluster):
    with pytest.raises(DataParallelError, match="find_unused_parameters"):
        train_data_parallel(
            cluster,
            model=SkipsABranch,
            dataset=small_digits,
            config=CONFIG,
            method="ddp",
            world_size=2,
            comm_timeout=30,
            timeout=300,
        )


def test_what_the_kit_knows_about_a_method_is_on_its_class():
    for name, cls in EXCHANGES.items():
        assert cls.name == name
        if cls.checkpointable:  # rank 0's weights are the run's state only then
            assert cls.averages_every_step and not cls.compresses, name
        else:
            assert cls.not_checkpointable_because != GradientExchange.not_checkpointable_because
    assert checkpointable_methods() == sorted(
        [
            "parameter_server",
            "parameter_server_source000",
            "allreduce_naive",
            "ring",
            "builtin",
            "bucketed",
            "zero0",
            "zero1",
            "zero2",
            "zero3",
        ]
    )
    assert demo_methods() == [
        "parameter_server",
        "parameter_server_source000",
        "allreduce_naive",
        "ring",
        "builtin",
        "bucketed",
        "ddp",
        "zero0",
        "zero1",
        "zero2",
        "zero3",
    ]


def test_checkpointing_refuses_with_the_reason_the_class_gives(tmp_path):
    with pytest.raises(ValueError, match="error-feedback residual.*work with allreduce_naive"):
        prepare_checkpointing(make_exchange("compressed"), tmp_path, None, 2)
    cls = notebook_class()  # a method that does not say: refused, with the default reason
    with pytest.raises(ValueError, match="not known to keep its whole state"):
        prepare_checkpointing(cls(), tmp_path, None, 2)


def test_a_saved_bucketed_run_fixes_the_ring():
    assert BucketedAllreduce(64).for_saved_run().algorithm == "ring"
    doubling = BucketedAllreduce(64, "doubling")
    assert doubling.for_saved_run() is doubling


def test_the_prediction_reads_the_collective_from_the_class():
    from course_lib.cost_model.alpha_beta import LinkModel

    link = LinkModel(alpha=1e-4, beta=1e-8)
    kwargs = dict(nbytes=4e6, world_size=4, global_batch=64, compute_per_sample=1e-3, link=link)
    by_name, by_object = (
        predict_step("ring", **kwargs),
        predict_step(make_exchange("ring"), **kwargs),
    )
    assert by_name == by_object and by_name.exchange_s > 0
    star = predict_step("parameter_server", **kwargs)
    assert star.exchange_s > by_name.exchange_s  # the server's link carries (N-1) S each way
    with pytest.raises(ValueError, match="no cost model for method 'ddp_compressed'"):
        predict_step("ddp_compressed", **kwargs)
    with pytest.raises(ValueError, match="no cost model"):
        predict_step(notebook_class()(), **kwargs)


def test_progress_follows_rank_0s_steps(cluster, capsys):
    result = train_data_parallel(
        cluster,
        model="mlp",
        dataset=small_digits,
        config=CONFIG,
        method="ring",
        world_size=2,
        progress=True,
    )
    steps = len(result.records) // 2
    shown = capsys.readouterr().err  # tqdm writes text outside a notebook
    assert "ring on 2 engines" in shown and f"{steps}/{steps}" in shown, shown[-300:]
