"""Lecture 8: source 001's recorded runs over many seeds, several records side by side in two compact tables.

The benchmark (``bench/bench_sync_schemes.py --seeds N --store ...``) stores one record per link
rate; lecture 8 reads them beside each other: one line per configuration (accuracy and
communication time less, a column per record) and one line per claim of the paper (the kit's
mean and 95 % interval per record, with the verdict of :func:`~course_lib.papers.seeds.judge`
in a word). The verdicts are :func:`~course_lib.papers.source001_configurations.seed_claims`',
the same code that judges the live seeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from course_lib.papers.seeds import spread
from course_lib.papers.source001_configurations import SEED_CLAIMS, seed_claims

__all__ = ["claims_side_by_side", "configurations_side_by_side"]

#: :func:`~course_lib.papers.seeds.judge`'s words, short
_SHORT = {
    "within": "agrees",
    "below": "kit below",
    "above": "kit above",
    "not resolved": "not resolved",
}
#: each claim in a few words, in :data:`SEED_CLAIMS`' order (the paper's range is its own column)
_CLAIMS = (
    "best (9 vs 1): points lost",
    "best (9 vs 1): comm less",
    "Local-SGD(4) (4 vs 1): points lost",
    "Local-SGD(16) (7 vs 1): points lost",
    "Local-SGD(32) (10 vs 1): points lost",
    "gossip (2 vs 1): points lost",
    "gossip (2 vs 1): comm less",
    "sparse, p = 1 (3 vs 2): points lost",
    "sparse, p = 4 (6 vs 5): points lost",
    "sparse, p = 16 (9 vs 8): points lost",
    "sparse, p = 1 (3 vs 2): comm less",
)


def _rows(runs: list[list[dict[str, Any]]], number: int) -> list[dict[str, Any]]:
    return [next(r for r in rows if r["number"] == number) for rows in runs]


def configurations_side_by_side(records: Mapping[str, list[list[dict[str, Any]]]]) -> str:
    """One line per configuration: mean accuracy and comm less than configuration 1, per record;
    values and bytes fewer (the same in every record: counted, not timed) from the first."""
    labels = list(records)
    width = max(12, *(len(label) + 2 for label in labels))
    head = f"{'#':>2} {'p':>3} {'averaging':<14}"
    head += "".join(f"{'acc % ' + label:>{width + 6}}" for label in labels)
    head += f"{'fewer values':>13}{'fewer bytes':>12}"
    head += "".join(f"{'comm less ' + label:>{width + 10}}" for label in labels)
    lines = [head]
    first = records[labels[0]]
    for number in sorted({r["number"] for rows in first for r in rows}):
        mine = _rows(first, number)
        base = _rows(first, 1)
        line = f"{number:>2} {mine[0]['period']:>3} {mine[0]['averaging']:<14}"
        for label in labels:
            acc = spread([r["acc"] for r in _rows(records[label], number)], scale=100)
            line += f"{f'{acc.mean:.1f} +- {acc.sd:.1f}':>{width + 6}}"
        fewer = spread(
            [b["values"] / max(r["values"], 1e-12) for b, r in zip(base, mine, strict=True)]
        )
        nbytes = spread([b["bytes"] / max(r["bytes"], 1) for b, r in zip(base, mine, strict=True)])
        line += f"{fewer.mean:>12.1f}x{nbytes.mean:>11.1f}x"
        for label in labels:
            runs = records[label]
            less = spread(
                [b["comm"] / max(r["comm"], 1e-12)
                 for b, r in zip(_rows(runs, 1), _rows(runs, number), strict=True)]
            )  # fmt: skip
            line += f"{f'{less.mean:.1f}x':>{width + 10}}"
        lines.append(line)
    seeds = ", ".join(f"{label}: {len(runs)} seeds" for label, runs in records.items())
    lines.append(f"(means over seeds; accuracy +- its sd; {seeds})")
    return "\n".join(lines)


def claims_side_by_side(records: Mapping[str, list[list[dict[str, Any]]]]) -> str:
    """One line per claim of source 001: the paper's range, then per record the kit's mean,
    its 95 % interval and where that interval lies against the range."""
    judged = {label: seed_claims(runs) for label, runs in records.items()}
    width = 36
    lines = [
        f"{'claim (figure)':<37}{'paper':>11}   "
        + "".join(f"{label + ': mean [95 % interval]':<{width}}" for label in records).rstrip()
    ]
    for i, (short, (*_, low, high)) in enumerate(zip(_CLAIMS, SEED_CLAIMS, strict=True)):
        paper = f">= {low:g}" if high == float("inf") else f"{low:g} to {high:g}"
        line = f"{short:<37}{paper:>11}   "
        for label in records:
            c = judged[label][i]
            lo, hi = c["kit"].interval()
            cell = f"{c['kit'].mean:.1f} [{lo:.1f}, {hi:.1f}] {_SHORT[c['where']]}"
            line += f"{cell:<{width}}"
        lines.append(line.rstrip())
    lines.append(
        "points lost: the base's accuracy minus this one's, seed by seed; comm less: the base's "
        "communication time over this one's;\nagrees / kit above / kit below: the 95 % interval "
        "inside / above / below the paper's range; not resolved: it straddles an end"
    )
    return "\n".join(lines)
