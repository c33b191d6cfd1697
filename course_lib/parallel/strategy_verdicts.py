"""Lecture 13: The scoreboard's conclusions, computed from this run's numbers and their spread.

Lecture 13 holds the simulator's predictions against strategies run on the engines. Every
sentence it prints about them comes from here, from the numbers of the run: :func:`scoreboard`
times the candidates in interleaved rounds (a burst of load hits every strategy alike; each keeps
the spread of its rounds, :mod:`course_lib.timing`), :func:`pick_sentence` says whether the
simulator's pick is the measured best, beaten, or within this run's noise of it,
:func:`order_sentence` how many of the pairs the simulator separates the measurements order the
same way, :func:`rule_sentence` whether a predicted lead is large enough, against the simulator's
measured error, to support a rule of thumb, and :func:`compute_shares_sentence` where the
compute goes. Tests feed each function swapped numbers and see its sentence change.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

from course_lib.timing import Spread, compare

__all__ = [
    "compute_shares_sentence",
    "error_sentence",
    "order_sentence",
    "pick_sentence",
    "rule_sentence",
    "scoreboard",
]


def scoreboard(
    cluster, candidates: Mapping[str, Any], model: str, batch: int, *,
    rounds: int = 3, steps: int = 3, comm_name: str = "comm",
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Run every candidate (a strategy's name, or a configuration tuple) once per round, in turn.

    A round's number is the median of its ``steps`` steps (each the slowest engine's, after a
    warm-up step); returns per candidate its :class:`~course_lib.timing.Spread` over the rounds,
    the last round's per-engine results and the seconds its runs took.
    """
    from course_lib.parallel.strategy_mixed import run_configs
    from course_lib.parallel.strategy_runs import run_strategy

    out: dict[str, dict[str, Any]] = {n: {"samples": [], "seconds": 0.0} for n in candidates}
    for _ in range(rounds):
        for name, what in candidates.items():
            fn = run_strategy if isinstance(what, str) else run_configs
            t0 = time.perf_counter()
            runs = cluster.run(fn, what, comm_name, model, batch, steps, timeout=300)
            out[name]["seconds"] += time.perf_counter() - t0
            walls = [max(step) for step in zip(*(r["walls"] for r in runs), strict=True)]
            out[name]["samples"].append(statistics.median(walls))
            out[name]["runs"] = runs
    for row in out.values():
        row["spread"] = Spread.of(row.pop("samples"))
    return out


def pick_sentence(predicted: Mapping[str, float], measured: Mapping[str, Spread]) -> str:
    """Say whether the simulator's pick (least predicted time) is the measured best."""
    pick = min(predicted, key=predicted.__getitem__)
    order = sorted(measured, key=lambda n: measured[n].median)
    best = order[0]
    if pick != best:
        c = compare(pick, measured[pick], best, measured[best])
        if c.within_noise:
            return f"the simulator's pick, {pick}, and the measured best, {best}: {c.sentence}"
        return (
            f"the simulator's pick, {pick}, is {c.ratio**-1:.2f}× slower when run than the "
            f"measured best, {best}: {c.sentence}"
        )
    if len(order) == 1:
        return f"the simulator's pick, {pick}, is the only one measured"
    c = compare(pick, measured[pick], order[1], measured[order[1]])
    if c.within_noise:
        return f"the simulator's pick, {pick}, has the lowest median, but {c.sentence}"
    return f"the simulator's pick, {pick}, is the measured best: {c.sentence}"


def error_sentence(predicted: Mapping[str, float], measured: Mapping[str, Spread]) -> str:
    """Return the median |error| of the predictions and whether they lean low or high."""
    errors = [(predicted[n] - measured[n].median) / measured[n].median for n in predicted]
    low = sum(e < 0 for e in errors)
    lean = (
        f"{low} of {len(errors)} predictions below their measurement"
        if low * 2 != len(errors)
        else "as many predictions below their measurement as above"
    )
    return f"median |error| {statistics.median(abs(e) for e in errors):.0%}; {lean}"


def order_sentence(
    predicted: Mapping[str, float], measured: Mapping[str, Spread], margin: float = 0.1
) -> str:
    """Count the pairs the simulator separates by more than ``margin`` that the runs order alike."""
    names = list(predicted)
    same = other = noise = 0
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            fast, slow = (a, b) if predicted[a] < predicted[b] else (b, a)
            if predicted[slow] < predicted[fast] * (1 + margin):
                continue
            c = compare(fast, measured[fast], slow, measured[slow])
            if c.within_noise:
                noise += 1
            elif c.ratio > 1:
                same += 1
            else:
                other += 1
    total = same + other + noise
    if not total:
        return f"the simulator separates no pair by more than {margin:.0%}: nothing to order"
    verdict = (
        "the measurements support the simulator's order"
        if same > 2 * (other + noise)
        else "the measurements do not support the simulator's order"
    )
    return (
        f"of {total} pairs the simulator separates by more than {margin:.0%}, the runs order "
        f"{same} the same way, {other} the other way, {noise} within this run's noise: {verdict}"
    )


def rule_sentence(
    rule: str, lead: str, lead_value: float, other: str, other_value: float, error: float
) -> str:
    """Say whether ``lead`` beats ``other`` (samples/s, larger is better) by more than ``error``."""
    gap = lead_value / other_value - 1
    if gap > error:
        return (
            f"{rule}: {lead} predicted {gap:.0%} ahead of {other}, more than the simulator's "
            f"error measured here ({error:.0%}): the numbers support the rule"
        )
    ahead = f"{gap:.0%} ahead of" if gap >= 0 else f"{-gap:.0%} behind"
    return (
        f"{rule}: {lead} predicted {ahead} {other}, within the simulator's error measured here "
        f"({error:.0%}): these numbers do not support the rule"
    )


def compute_shares_sentence(
    part: str, compute: float, weights: float, rest: str, total_compute: float, total_weights: float
) -> str:
    """Say what share of the compute and of the weights ``part`` holds, and which way it leans."""
    c, w = compute / total_compute, weights / total_weights
    if c > w:
        lean = f"{part} take a larger share of the time than of the weights: compute {c:.0%}, weights {w:.0%}"
    else:
        lean = f"{part} take a smaller share of the time than of the weights: compute {c:.0%}, weights {w:.0%}"
    return f"{lean}; {rest} the rest (measured costs, minimum of repeats)"
