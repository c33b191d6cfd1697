"""Lecture 8: one figure over several seeds, its spread, and a verdict against a paper's range.

One seed cannot say whether the kit agrees with a paper: on the digits test set (297 images) one
accuracy carries a standard error of about 2 points, the size of the papers' effects. So each
figure compared with a paper is measured over seeds (the same seed trains both configurations
of a difference: the differences are paired) and judged by its 95 % confidence interval,
mean +- t * sd / sqrt(n) (Student's t: with 3 seeds t = 4.30, so the interval is wide)::

    cost = paired([0.91, 0.90, 0.92], [0.89, 0.88, 0.90], scale=100)  # points lost, seed by seed
    print(cost, judge(cost, 1.0, 3.0))  # "2.0 +- 0.0 [2.0 to 2.0], 3 seeds" "within"

:func:`judge` says ``"within"`` (the interval lies inside the paper's range: agrees),
``"below"`` / ``"above"`` (it lies wholly outside: disagrees), or ``"not resolved"`` (it
straddles an end of the range: these seeds cannot tell).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Spread", "agreement", "judge", "paired", "record", "recorded", "spread", "t_quantile"]

#: Student's t, 97.5 % quantile (two-sided 95 %), by degrees of freedom; above 20 the value at
#: 20 (slightly wide: the interval errs towards "not resolved").
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)  # fmt: skip


def t_quantile(dof: int) -> float:
    """Return Student's t at 97.5 % for ``dof`` degrees of freedom (a 95 % two-sided interval)."""
    if dof < 1:
        raise ValueError(f"dof={dof!r}: an interval needs at least 2 seeds (1 degree of freedom)")
    return _T975[min(dof, len(_T975)) - 1]


@dataclass(frozen=True)
class Spread:
    """One figure measured over seeds: its values, mean, standard deviation, range, interval."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        """Return the number of seeds."""
        return len(self.values)

    @property
    def mean(self) -> float:
        """Return the mean over the seeds."""
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float:
        """Return the sample standard deviation (0 for one seed)."""
        return statistics.stdev(self.values) if self.n > 1 else 0.0

    @property
    def low(self) -> float:
        """Return the smallest seed's value."""
        return min(self.values)

    @property
    def high(self) -> float:
        """Return the largest seed's value."""
        return max(self.values)

    def interval(self) -> tuple[float, float]:
        """Return the 95 % confidence interval of the mean (unbounded for one seed)."""
        if self.n < 2:
            return (-math.inf, math.inf)
        half = t_quantile(self.n - 1) * self.sd / math.sqrt(self.n)
        return (self.mean - half, self.mean + half)

    def format(self, digits: int = 1) -> str:
        """Return e.g. ``"2.0 +- 1.0 [1.0-3.0], 3 seeds"`` (mean +- sd [min-max])."""
        f = f"{{:.{digits}f}}"
        if self.n == 1:
            return f"{f.format(self.mean)}, one seed"
        return (
            f"{f.format(self.mean)} +- {f.format(self.sd)} "
            f"[{f.format(self.low)} to {f.format(self.high)}], {self.n} seeds"
        )

    def __str__(self) -> str:
        return self.format()


def spread(values: Sequence[float], scale: float = 1.0) -> Spread:
    """Return the spread of ``values`` (one per seed), each multiplied by ``scale``."""
    if len(values) == 0:
        raise ValueError("spread of no values: run at least one seed")
    return Spread(tuple(scale * float(v) for v in values))


def paired(base: Sequence[float], other: Sequence[float], scale: float = 1.0) -> Spread:
    """Return ``scale * (base - other)`` seed by seed: e.g. accuracy points lost by ``other``.

    Both sequences list the same seeds in the same order (the same seed trains both runs), so
    the seed's own luck cancels in each difference.
    """
    if len(base) != len(other):
        raise ValueError(
            f"paired: {len(base)} base values vs {len(other)}: give one value per seed to both"
        )
    return spread([b - o for b, o in zip(base, other, strict=True)], scale)


def judge(figure: Spread, low: float, high: float) -> str:
    """Return where ``figure``'s 95 % interval lies against the paper's range [low, high].

    ``"within"``: inside it (agrees); ``"below"`` / ``"above"``: wholly outside (disagrees);
    ``"not resolved"``: it straddles an end, or one seed gives no interval.
    """
    if low > high:
        raise ValueError(f"range [{low}, {high}]: low must not exceed high")
    lo, hi = figure.interval()
    if hi < low:
        return "below"
    if lo > high:
        return "above"
    if low <= lo and hi <= high:
        return "within"
    return "not resolved"


def agreement(figure: Spread, low: float, high: float) -> str:
    """Return a verdict in words: "agrees", "disagrees (kit below)", or "not resolved ...".

    Computed by :func:`judge`; the interval is printed beside it, so a reader can check it.
    """
    where = judge(figure, low, high)
    lo, hi = figure.interval()
    if where == "within":
        return f"agrees (95 % interval {lo:.1f} to {hi:.1f} inside)"
    if where in ("below", "above"):
        return f"disagrees: kit {where} (95 % interval {lo:.1f} to {hi:.1f} outside)"
    if figure.n < 2:
        return "not resolved (one seed: no interval)"
    return f"not resolved by {figure.n} seeds (95 % interval {lo:.1f} to {hi:.1f} straddles it)"


def record(path: str, runs: list[list[dict]], **about: object) -> None:
    """Write ``runs`` (one list of rows per seed) and ``about`` (where, when, load) as JSON."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        json.dump({**about, "runs": runs}, f, indent=1, sort_keys=True, default=float)
        f.write("\n")


def recorded(path: str) -> dict:
    """Return a file written by :func:`record`: its ``runs`` and what it says about them."""
    import json

    with open(path, encoding="utf-8") as f:
        return json.load(f)
