"""Lecture 8's evidence over seeds: the spread, paired differences and the verdicts drawn from them.

Hand-computed values: the mean, sample standard deviation and 95 % t interval of small lists,
and the verdict each interval gives against a paper's range; then source 001's claims and
source 000's goal judged from hand-written rows (one list per seed).
"""

from __future__ import annotations

import math

import pytest

from course_lib.papers.seeds import (
    agreement,
    judge,
    paired,
    record,
    recorded,
    spread,
    t_quantile,
)
from course_lib.papers.source000_table import goal_over_seeds, seeds_side_by_side
from course_lib.papers.source001_configurations import (
    compare_seeds_with_paper,
    seed_claims,
    seeds_table,
)


def test_spread_by_hand() -> None:
    s = spread([1.0, 2.0, 6.0])
    assert s.n == 3 and s.mean == 3.0 and (s.low, s.high) == (1.0, 6.0)
    assert s.sd == pytest.approx(math.sqrt(7.0))  # ((4 + 1 + 9) / 2) ** 0.5, sample sd
    lo, hi = s.interval()
    half = 4.303 * math.sqrt(7.0) / math.sqrt(3)  # t(0.975, 2 dof) = 4.303
    assert (lo, hi) == pytest.approx((3.0 - half, 3.0 + half))
    assert s.format(1) == "3.0 +- 2.6 [1.0 to 6.0], 3 seeds"
    assert spread([0.5], scale=100).format() == "50.0, one seed"
    assert spread([0.5]).interval() == (-math.inf, math.inf)
    assert t_quantile(1) == 12.706 and t_quantile(4) == 2.776 and t_quantile(100) == 2.086
    with pytest.raises(ValueError, match="at least one seed"):
        spread([])


def test_paired_differences_cancel_the_seed() -> None:
    # the seeds differ by 5 points, the configurations by exactly 2: paired, no spread at all
    cost = paired([0.90, 0.85, 0.95], [0.88, 0.83, 0.93], scale=100)
    assert cost.values == pytest.approx((2.0, 2.0, 2.0)) and cost.sd == pytest.approx(0.0)
    with pytest.raises(ValueError, match="one value per seed"):
        paired([0.9, 0.8], [0.9])


@pytest.mark.parametrize(
    ("values", "low", "high", "where"),
    [
        ([2.0, 2.1, 1.9], 1.0, 3.0, "within"),  # interval 1.75 to 2.25
        ([2.0, 2.1, 1.9], 3.0, 4.0, "below"),
        ([2.0, 2.1, 1.9], -1.0, 1.0, "above"),
        ([2.0, 4.0, 0.0], 1.0, 3.0, "not resolved"),  # interval -2.97 to 6.97
        ([2.9, 3.0, 3.1], 1.0, 3.0, "not resolved"),  # straddles the top end
        ([2.0], 1.0, 3.0, "not resolved"),  # one seed: no interval
        ([2.5, 2.6, 2.4], 2.0, math.inf, "within"),  # "at least 2x"
        ([2.5, 2.6, 2.4], -math.inf, 1.0, "above"),  # "at most 1 point"
    ],
)
def test_judge_by_the_interval(values, low, high, where) -> None:
    assert judge(spread(values), low, high) == where


def test_agreement_words_follow_judge() -> None:
    assert agreement(spread([2.0, 2.1, 1.9]), 1.0, 3.0).startswith("agrees")
    assert agreement(spread([2.0, 2.1, 1.9]), 3.0, 4.0).startswith("disagrees: kit below")
    assert agreement(spread([2.0, 4.0, 0.0]), 1.0, 3.0).startswith("not resolved by 3 seeds")
    assert agreement(spread([2.0]), 1.0, 3.0) == "not resolved (one seed: no interval)"
    with pytest.raises(ValueError, match="low must not exceed high"):
        judge(spread([1.0, 2.0]), 3.0, 1.0)


def test_record_round_trip(tmp_path) -> None:
    path = str(tmp_path / "runs.json")
    record(path, [[{"number": 1, "acc": 0.9}]], when="2026-11-28", load=[5.0])
    back = recorded(path)
    assert back["runs"] == [[{"number": 1, "acc": 0.9}]] and back["when"] == "2026-11-28"


def _s001_rows(acc1: float, shift: dict[int, float], comm9: float) -> list[dict]:
    """One seed's ten rows: configuration k's accuracy acc1 - shift[k], comm 1.0 (9: comm9)."""
    periods = {1: 1, 2: 1, 3: 1, 4: 4, 5: 4, 6: 4, 7: 16, 8: 16, 9: 16, 10: 32}
    kinds = ["allreduce", "gossip", "gossip_sparse"] * 3 + ["allreduce"]
    return [
        {"number": k, "period": periods[k], "averaging": kinds[k - 1],
         "acc": acc1 - shift.get(k, 0.0), "comm": comm9 if k == 9 else (40.0 if k == 1 else 1.0),
         "values": 1000.0 / k, "bytes": 4000.0 / k}
        for k in range(1, 11)
    ]  # fmt: skip


def test_source001_claims_over_seeds() -> None:
    # configuration 9 loses exactly 2 points in every seed, while the seeds differ by 6 points:
    # paired, the cost is 2.0 with no spread, inside the paper's 1-3; its comm is 40x less
    runs = [_s001_rows(a, {9: 0.02, 8: 0.02, 2: 0.10}, 1.0) for a in (0.84, 0.90, 0.87)]
    claims = {(c["number"], c["base"], c["figure"]): c for c in seed_claims(runs)}
    best = claims[9, 1, "cost"]
    assert best["kit"].mean == pytest.approx(2.0) and best["where"] == "within"
    assert (best["low"], best["high"]) == (1.0, 3.0)  # the paper's 1-3 points
    assert claims[9, 1, "comm"]["kit"].mean == pytest.approx(40.0)
    assert claims[9, 1, "comm"]["where"] == "within"  # 40x: reached
    assert claims[2, 1, "cost"]["where"] == "above"  # 10 points against the paper's ~2
    assert claims[9, 8, "cost"]["where"] == "within"  # 0 points: "almost nothing"
    assert claims[4, 1, "cost"]["where"] == "below"  # 0 points against 2-4
    text = compare_seeds_with_paper(runs)
    assert text.startswith("over 3 seeds") and "disagrees: kit above" in text
    table = seeds_table(runs)
    assert "87.0 +- 3.0 [84.0 to 90.0], 3 seeds" in table.splitlines()[1]
    with pytest.raises(ValueError, match="configuration 9"):
        seed_claims([[r for r in runs[0] if r["number"] != 9]])


def test_two_records_side_by_side_compact_and_judged_as_one() -> None:
    # Lecture 8's compact view: one line per configuration and one per claim, a column per
    # record; the claim's word is seed_claims' own, so other numbers print another word.
    from course_lib.papers.source001_records import claims_side_by_side, configurations_side_by_side

    near = [_s001_rows(a, {9: 0.02, 8: 0.02, 2: 0.10}, 1.0) for a in (0.84, 0.90, 0.87)]
    far = [_s001_rows(a, {9: 0.08, 8: 0.08, 2: 0.10}, 1.0) for a in (0.84, 0.90, 0.87)]
    records = {"fast": near, "slow": far}
    table = configurations_side_by_side(records)
    assert len(table.splitlines()) == 1 + 10 + 1  # a header, ten configurations, a note
    claims = claims_side_by_side(records).splitlines()
    assert len(claims) == 1 + 11 + 2  # a header, eleven claims, two lines of legend
    best = claims[1]
    assert best.startswith("best (9 vs 1): points lost") and "1 to 3" in best
    assert "2.0 [2.0, 2.0] agrees" in best and "8.0 [8.0, 8.0] kit above" in best
    assert [c["where"] for c in seed_claims(far)][0] == "above"


def _s000(name: str, epoch_s: float, acc: float) -> dict:
    return {"name": name, "epoch_s": epoch_s, "sync_s": epoch_s / 2, "accuracy": acc}


def test_source000_goal_over_seeds() -> None:
    def runs(speeds, losses, base_accs=(0.80, 0.70, 0.75)):
        return [[_s000("float32", 10.0, a), _s000("int8n+EF+zstd", 10.0 / s, a - d / 100)]
                for a, s, d in zip(base_accs, speeds, losses, strict=True)]  # fmt: skip

    met = goal_over_seeds(runs((3.5, 3.6, 3.4), (0.1, 0.2, 0.0)))
    assert "goal (>= 2x, <= 1 point): MET" in met[0] and "aim (>= 3x, <= 0.5): MET" in met[0]
    lossy = goal_over_seeds(runs((3.5, 3.6, 3.4), (2.0, 2.1, 1.9)))
    assert "goal (>= 2x, <= 1 point): NOT MET" in lossy[0]
    slow = goal_over_seeds(runs((1.5, 1.6, 1.4), (0.1, 0.2, 0.0)))
    assert "goal (>= 2x, <= 1 point): NOT MET" in slow[0]
    noisy = goal_over_seeds(runs((3.5, 3.6, 3.4), (-2.0, 3.0, 0.5)))  # mean 0.5, wide
    assert "goal (>= 2x, <= 1 point): NOT RESOLVED" in noisy[0]
    stuck = goal_over_seeds(runs((3.5, 3.6, 3.4), (0.1, 0.2, 0.0)), majority=0.9)
    assert "accuracy NOT CHECKED" in stuck[0]
    assert "not checked" in goal_over_seeds([[_s000("float32", 1.0, 0.5)]])[0]
    table = seeds_side_by_side(runs((3.5, 3.6, 3.4), (0.1, 0.2, 0.0)))
    assert "3.50 +- 0.10 [3.40 to 3.60], 3 seeds" in table.splitlines()[2]
