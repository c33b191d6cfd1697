"""Source 001's ten configurations: the numbering, and the figures computed from a run's records.

The runs themselves are measured by the notebook (08) and ``bench/bench_sync_schemes.py``; here
the arithmetic is checked on hand-written step records whose right answers are known.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from course_lib.papers.source001_configurations import (
    CONFIGURATIONS,
    GRADIENT_THRESHOLD,
    WEIGHT_THRESHOLD,
    compare_with_paper,
    configurations_table,
    predict_values_sent,
    row_from_result,
)
from course_lib.training.loop import History

SOURCE_001 = {  # DIGEST, "001", Experiments: the list as the source numbers it
    1: (1, "allreduce"), 2: (1, "gossip"), 3: (1, "gossip_sparse"),
    4: (4, "allreduce"), 5: (4, "gossip"), 6: (4, "gossip_sparse"),
    7: (16, "allreduce"), 8: (16, "gossip"), 9: (16, "gossip_sparse"),
    10: (32, "allreduce"),
}  # fmt: skip


def test_configurations_follow_the_source_numbering():
    assert {k: (c.period, c.averaging) for k, c in CONFIGURATIONS.items()} == SOURCE_001
    assert CONFIGURATIONS[9].label == "9: Local-SGD(16) + gossip + sparsification"
    assert CONFIGURATIONS[3].options()["threshold"] == GRADIENT_THRESHOLD  # gradients at p = 1
    assert CONFIGURATIONS[9].options() == {
        "method": "local_sgd",
        "period": 16,
        "averaging": "gossip_sparse",
        "threshold": WEIGHT_THRESHOLD,
    }
    assert "threshold" not in CONFIGURATIONS[8].options()


def _result(averaging_records, accuracies=(0.9, 0.8)):
    """Two ranks, two steps each; rank 0's steps span 0.0 .. 3.0 s."""
    records = []
    for rank in (0, 1):
        for step, extra in enumerate(averaging_records[rank]):
            start = 1.5 * step
            records.append(
                {
                    "rank": rank,
                    "step": step,
                    "compute_at": (start, start + 1.0),
                    "comm_at": (start + 1.0, start + 1.5),
                    "comm_s": 0.25,
                    "sync_s": 0.0,
                    "wait_s": 0.5,
                    "bytes_sent": 0,
                    "collective_bytes": 0,
                    **extra,
                }
            )
    histories = [History(epochs=[{"test_accuracy": a}]) for a in accuracies]
    return SimpleNamespace(world_size=2, records=records, histories=histories, label="link")


def test_row_of_an_allreduce_run():
    result = _result([[{"collective_bytes": 400}] * 2] * 2)
    row = row_from_result(result, 1)
    assert row["acc"] == pytest.approx(0.85)  # mean over the replicas
    assert row["total"] == pytest.approx(3.0)  # rank 0: first compute start to last end
    assert row["comm"] == pytest.approx(0.5)  # 2 steps x 0.25 s, per rank
    assert row["sync"] == pytest.approx(1.5)  # communication + 2 x 0.5 s waiting
    assert row["bytes"] == 800
    assert row["values"] == pytest.approx(200 * 2 * (2 - 1) / 2)  # ring: 2(N-1)/N per value


def test_row_of_a_sparse_gossip_run_counts_every_partner_message():
    # step 0: 10 values to two partners (2 x (8 + 8 * 10) bytes); step 1: 3 values to one partner
    steps = [{"values_sent": 10, "bytes_sent": 2 * 88}, {"values_sent": 3, "bytes_sent": 32}]
    row = row_from_result(_result([steps, steps]), 9)
    assert row["values"] == 23
    assert row["bytes"] == 2 * 88 + 32
    # with 4 presence flags beside the values in every message: the same values
    flagged = [
        {**step, "flags_sent": 4, "bytes_sent": step["bytes_sent"] + 32 * m}
        for step, m in zip(steps, (2, 1), strict=True)
    ]
    assert row_from_result(_result([flagged, flagged]), 9)["values"] == 23


def test_row_of_a_gossip_run_leaves_the_presence_flags_out_of_the_values():
    steps = [{"bytes_sent": 2 * 4 * (100 + 4)}, {"bytes_sent": 4 * (100 + 4)}]  # 2 + 1 messages
    result = _result([steps, steps])
    result.gradient_bytes, result.flag_bytes = 400, 16
    assert row_from_result(result, 2)["values"] == 3 * 100


def test_table_and_comparison_are_computed_from_the_rows():
    base = row_from_result(_result([[{"collective_bytes": 2000}] * 2] * 2, (0.90, 0.90)), 1)
    best = row_from_result(
        _result([[{"values_sent": 5, "bytes_sent": 48}] * 2] * 2, (0.88, 0.88)), 9
    )
    assert base["values"] == 1000 and best["values"] == 10
    table = configurations_table([base, best])
    assert "100.0x" in table.splitlines()[2]  # 1000 / 10 values
    text = compare_with_paper([base, best])
    assert "100x fewer values" in text and "losing 2.0 accuracy points" in text
    assert "within the paper's 1-3 points" in text
    with pytest.raises(ValueError, match="configuration 1"):
        configurations_table([best])


def test_predicted_values_sent():
    assert predict_values_sent("allreduce", 100, 4, 92, 16) == 5 * 100 * 1.5
    # P = 4: s = 1 (two partners), s = 2 (one), ...: 2 + 1 + 2 + 1 + 2 messages in 5 gossips
    assert predict_values_sent("gossip", 100, 4, 92, 16) == 8 * 100
    assert predict_values_sent("gossip", 100, 5, 10, 1) == 20 * 100  # P = 5: always two
    with pytest.raises(ValueError, match="sparse"):
        predict_values_sent("gossip_sparse", 100, 4, 10)


def test_local_sgd_counts_the_flags_its_gradient_gossip_sends():
    # Period 1 with gossip is source 001's Algorithm 2: the gradient gossip sends a presence
    # flag per tensor beside the values, which row_from_result leaves out of the values.
    from course_lib.parallel.exchanges.local_sgd import LocalSGD

    assert LocalSGD(1, "gossip").flag_bytes(4) == 16
    assert LocalSGD(1, "gossip_sparse").flag_bytes(4) == 16
    assert LocalSGD(16, "gossip").flag_bytes(4) == 0  # averages weights: no flags
    assert LocalSGD(1, "allreduce").flag_bytes(4) == 0
