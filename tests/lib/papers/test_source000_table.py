"""Source 000's Table 2 re-measured: the regime's rate formula, the rows, the verdicts.

The formula is checked against the star's own cost (the share it gives back is the source's);
a row is checked against hand-computed figures from synthetic records, and once against a real
run: 2 engines, a tiny U-Net, 2 steps of int8 + error feedback + zstd through the star.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from course_lib.data import load_dataset
from course_lib.papers.source000_table import (
    CONFIGS_BY_NAME,
    PAPER_SYNC_SHARE,
    PAPER_TABLE2,
    format_side_by_side,
    goal_verdicts,
    regime_derivation,
    source_regime_rate,
    table_row,
)
from course_lib.parallel.data_parallel.train import DataParallelResult, train_data_parallel
from course_lib.training.loop import History, TrainConfig
from course_lib.training.models import UNet

pytestmark = pytest.mark.timeout(600)


def test_paper_table_is_the_sources() -> None:
    assert PAPER_TABLE2["float32"] == {
        "epoch_s": 96.996,
        "sync_s": 68.7,
        "wire_mb": 8.33,
        "ratio": 1.0,
    }
    assert PAPER_TABLE2["int8+mgzip"]["epoch_s"] == 43.62
    assert PAPER_SYNC_SHARE == pytest.approx(0.7083, abs=1e-4)


def test_regime_rate_by_hand() -> None:
    # B = 2 (N-1) S (1-f) / (f t_c) = 2 * 3 * 8e6 * 0.5 / (0.5 * 0.5) = 96e6
    assert source_regime_rate(0.5, 8e6, 4, sync_share=0.5) == pytest.approx(96e6)


@pytest.mark.parametrize(("compute_s", "nbytes", "n"), [(0.4, 7.8e6, 4), (2.0, 8.33e6, 6)])
def test_regime_rate_gives_back_the_sources_share(compute_s, nbytes, n) -> None:
    rate = source_regime_rate(compute_s, nbytes, n)
    sync = 2 * (n - 1) * nbytes / rate  # the star: N-1 gradients in, then N-1 means out
    assert sync / (sync + compute_s) == pytest.approx(68.7 / 96.996)
    text = regime_derivation(compute_s, nbytes, n)
    assert f"{rate / 1e6:.1f} MB/s" in text and f"N = {n}" in text


@pytest.mark.parametrize(
    ("args", "advice"),
    [
        ((0, 1e6, 4), "compute seconds"),
        ((0.1, -1, 4), "gradient"),
        ((0.1, 1e6, 1), "2 ranks"),
        ((0.1, 1e6, 4, 1.0), "fraction"),
    ],
)
def test_regime_rate_rejects_bad_input_with_advice(args, advice) -> None:
    with pytest.raises(ValueError, match=advice):
        source_regime_rate(*args)


def _record(rank: int, step: int, **values) -> dict:
    base = {
        "rank": rank,
        "step": step,
        "epoch": step // 2 + 1,
        "compute_s": 0.0,
        "step_s": 0.0,
        "wait_s": 0.0,
        "comm_s": 0.0,
        "total_s": 0.0,
        "bytes_sent": 0,
        "collective_bytes": 0,
        "bytes_gradient": 4000,
    }
    return {**base, **values}


def _synthetic_result() -> DataParallelResult:
    """2 ranks, 4 steps (2 per epoch); step 0 is slow (set-up) and must be left out."""
    records = []
    for step, (total, comm, coded) in enumerate(
        [(9.0, 5.0, 100), (1.0, 0.3, 200), (2.0, 0.5, 300), (1.5, 0.4, 400)]
    ):
        for rank in (0, 1):
            records.append(
                _record(
                    rank,
                    step,
                    total_s=total + rank * 0.1,
                    comm_s=comm + rank,
                    wait_s=0.1,
                    compute_s=0.4,
                    step_s=0.1,
                    code_s=0.01,
                    compress_s=0.02,
                    bytes_coded=coded + rank,
                )
            )
    epochs = [
        {"epoch": 1, "test_accuracy": 0.5, "test_miou": 0.2},
        {"epoch": 2, "test_accuracy": 0.75, "test_miou": 0.4},
    ]
    return DataParallelResult(
        method="compressed",
        world_size=2,
        label="emulated link 8 Mbit/s",
        emulated=True,
        histories=[History(epochs=epochs), History(epochs=epochs)],
        records=records,
        weights={},
        replicas_equal=True,
        max_replica_difference=0.0,
        gradient_bytes=4000,
    )


def test_row_from_synthetic_records() -> None:
    row = table_row(_synthetic_result(), CONFIGS_BY_NAME["int8+EF+zstd"])
    assert row["steps_per_epoch"] == 2 and row["epochs"] == 2
    # steps 1..3; the slowest rank (rank 1) lasts 1.1, 2.1, 1.6 s: median 1.6, times 2 steps
    assert row["epoch_s"] == pytest.approx(3.2)
    assert row["sync_s"] == pytest.approx(2 * (0.4 + 0.1))  # rank 0's comm + wait, median
    assert row["compute_s"] == pytest.approx(2 * 0.5)
    assert row["coding_s"] == pytest.approx(2 * 0.03)
    # bytes on the wire: the median over every rank's steps (step 0 too: sizes need no warm-up)
    assert row["wire_bytes"] == pytest.approx(250.5)
    assert row["ratio"] == pytest.approx(4000 / 250.5)
    assert (row["accuracy"], row["miou"]) == (0.75, 0.4)  # after the budget: the last epoch
    assert row["paper"] is None and row["link"] == "emulated link 8 Mbit/s"


def _row(name: str, epoch_s: float, accuracy: float) -> dict:
    return {
        "name": name,
        "epoch_s": epoch_s,
        "accuracy": accuracy,
        "miou": 0.3,
        "sync_s": 1.0,
        "coding_s": 0.0,
        "wire_bytes": 1e3,
        "ratio": 1.0,
        "paper": None,
        "link": "x",
    }


def test_goal_verdicts() -> None:
    base = _row("float32", 10.0, 0.800)
    met = goal_verdicts([base, _row("int8+EF+zstd", 4.0, 0.795)])
    assert len(met) == 1 and ": MET;" in met[0] and "aim (>= 3x, <= 0.5): not met" in met[0]
    aim = goal_verdicts([base, _row("best", 3.0, 0.797)])
    assert ": MET;" in aim[0] and "aim (>= 3x, <= 0.5): MET" in aim[0]
    slow = goal_verdicts([base, _row("int8+EF+zstd", 6.0, 0.80)])
    assert "NOT MET" in slow[0]
    lossy = goal_verdicts([base, _row("int8+EF+zstd", 2.0, 0.78)])
    assert "NOT MET" in lossy[0] and "+2.00 points" in lossy[0]
    assert "not checked" in goal_verdicts([base])[0]
    # float32 at the majority class's share: accuracy cannot separate the formats yet
    stuck = goal_verdicts([base, _row("best", 4.0, 0.80)], majority=0.8)
    assert "speed MET" in stuck[0] and "accuracy NOT CHECKED" in stuck[0]
    assert ": MET;" in goal_verdicts([base, _row("best", 4.0, 0.80)], majority=0.5)[0]
    nearest = goal_verdicts([base, _row("int8n+EF+zstd", 4.0, 0.795), _row("int8", 4.0, 0.5)])
    assert len(nearest) == 1 and "int8n+EF+zstd: 2.50x" in nearest[0]  # plain int8 not judged


def test_every_configuration_builds_a_valid_exchange() -> None:
    from course_lib.parallel.exchanges.compressed import CompressedExchange

    for config in CONFIGS_BY_NAME.values():
        exchange = CompressedExchange(**config.options)  # settings validated with advice
        assert exchange.carrier in ("parameter_server", "allgather"), config.name
    nearest = CompressedExchange(**CONFIGS_BY_NAME["int8n+EF+zstd"].options).compressor
    assert nearest.compressor.settings.rounding == "nearest"


def test_side_by_side_table_shows_the_papers_numbers() -> None:
    rows = [_row("float32", 10.0, 0.8) | {"paper": "float32"}, _row("int8+EF", 5.0, 0.8)]
    text = format_side_by_side(rows)
    assert "97.0" in text and "68.7" in text and "8.33" in text  # the paper's float32 column
    assert "2.00x" in text  # int8+EF against the measured float32


@pytest.fixture(scope="module")
def cluster(shared_engines):
    return shared_engines(2)  # from the session's pool (tests/conftest.py)


def test_row_from_a_real_run(cluster) -> None:
    config = CONFIGS_BY_NAME["int8+EF+zstd"]
    result = train_data_parallel(
        cluster,
        model=functools.partial(UNet, base_width=4, depth=2),
        dataset=functools.partial(load_dataset, "segmentation", num_tiles=8, tile_size=16),
        test_set=load_dataset("segmentation", train=False, num_tiles=4, tile_size=16),
        config=TrainConfig(num_epochs=1, batch_size=4, lr=3e-3, optimizer="adam"),
        method="compressed",
        comm_timeout=60,
        timeout=300,
        **config.options,
    )
    row = table_row(result, config)
    coded = [r["bytes_coded"] for r in result.records]
    assert row["steps_per_epoch"] == 2 and len(coded) == 4
    assert row["wire_bytes"] == pytest.approx(float(np.median(coded)))
    assert row["gradient_bytes"] == result.gradient_bytes
    assert row["ratio"] > 4  # int8 is 4x; zstd squeezes the many zeros further
    assert row["accuracy"] == result.history.last["test_accuracy"]
    assert row["miou"] == result.history.last["test_miou"]
    assert row["epoch_s"] > 0 and row["sync_s"] >= 0


def test_regime_exercise_check() -> None:
    from course_lib.checks.lecture08 import (
        check_regime_rate,
        one_hop_regime_rate,
        stub_regime_rate,
    )

    def mine(compute_s, gradient_bytes, world_size, sync_share):
        sync = compute_s * sync_share / (1 - sync_share)
        return 2 * (world_size - 1) * gradient_bytes / sync

    assert check_regime_rate(mine, verbose=False).passed
    stub = check_regime_rate(stub_regime_rate, verbose=False)
    assert not stub.passed and "not implemented" in str(stub)
    wrong = check_regime_rate(one_hop_regime_rate, exercise="8.4", verbose=False)
    assert not wrong.passed and "uploads" in str(wrong) and str(wrong).startswith("Exercise 8.4")
