"""summarize_steps / format_table on synthetic records: the median hides what happens on some steps only."""

from __future__ import annotations

import pytest

from course_lib.parallel.data_parallel.accounting import PHASES, format_table, summarize_steps


def local_sgd_like_records(steps: int = 9, period: int = 4, nbytes: int = 4000) -> list[dict]:
    """One rank that averages (sync phase + bytes) after every ``period``-th step only."""
    records = []
    for step in range(steps):
        averages = (step + 1) % period == 0
        rec = {"rank": 0, "step": step, **{f"{p}_s": 0.0 for p in PHASES}}
        rec["compute_s"] = 0.010
        rec["sync_s"] = 0.008 if averages else 0.0
        rec["total_s"] = rec["compute_s"] + rec["sync_s"]
        rec["bytes_sent"] = rec["bytes_received"] = 0
        rec["collective_bytes"] = nbytes if averages else 0
        rec["wire_bytes"] = 1.5 * nbytes if averages else 0  # a ring allreduce on 4 ranks
        records.append(rec)
    return records


def test_the_median_hides_periodic_averaging_and_the_mean_shows_it():
    records = local_sgd_like_records()  # step 0 skipped: 8 steps left, averaging on 2 of them
    (median,) = summarize_steps(records)
    (mean,) = summarize_steps(records, stat="mean")
    assert median["sync_s"] == 0.0 and median["collective_bytes"] == 0.0
    assert mean["sync_s"] == pytest.approx(0.008 * 2 / 8)
    assert mean["collective_bytes"] == pytest.approx(4000 * 2 / 8)
    assert mean["compute_s"] == pytest.approx(0.010) and mean["steps"] == 8
    assert "sync" not in format_table([median]) and "sync" in format_table([mean])
    assert f"{4000 * 2 / 8 / 1e3:9.1f}" in format_table([mean])
    assert mean["wire_bytes"] == pytest.approx(1.5 * 4000 * 2 / 8)
    assert f"{1.5 * 4000 * 2 / 8 / 1e3:9.1f}" in format_table([mean]).splitlines()[2]


def test_an_unknown_statistic_is_refused():
    with pytest.raises(ValueError, match="stat must be one of"):
        summarize_steps(local_sgd_like_records(), stat="max")
