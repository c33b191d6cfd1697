"""Lectures 2–15: Conclusions from timings that hold on a loaded machine: interleaved rounds, spreads, sentences computed from them.

A lecture never states a winner from one timing. It times the candidates in interleaved rounds
(A B C, A B C, …, so a burst of load hits every candidate alike), keeps each candidate's spread
(median, minimum, maximum), and lets :func:`compare` or :func:`ranking` write the sentence: a
ratio when the ranges are apart, "within this run's noise" when they overlap. A test feeds the
same function swapped numbers and sees the sentence change, so no conclusion is hard-coded.
Operator costs use :func:`min_of` (the minimum of repeats: load only ever adds time) and
:func:`too_noisy` warns when a spread is too wide to trust.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Comparison",
    "Spread",
    "compare",
    "interleaved_rounds",
    "load_line",
    "min_of",
    "ranking",
    "too_noisy",
]


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity (seconds, or any positive number)."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Spread needs at least one sample: time the candidate at least once")

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        """Return the spread of ``samples``."""
        return cls(tuple(float(s) for s in samples))

    @property
    def median(self) -> float:
        """The median sample."""
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        """The smallest sample."""
        return min(self.samples)

    @property
    def high(self) -> float:
        """The largest sample."""
        return max(self.samples)

    @property
    def relative_width(self) -> float:
        """(high − low) / median: 0 for identical repeats."""
        return (self.high - self.low) / self.median if self.median else float("inf")

    def overlaps(self, other: Spread) -> bool:
        """True when the two ranges [low, high] share a point."""
        return self.low <= other.high and other.low <= self.high

    def describe(self, unit: str = "ms", scale: float = 1e3) -> str:
        """Return e.g. ``'12.3 ms (11.9–13.0 over 5 rounds)'``."""
        n = len(self.samples)
        if n == 1:
            return f"{self.median * scale:.3g} {unit} (1 round: no spread)"
        return (
            f"{self.median * scale:.3g} {unit} "
            f"({self.low * scale:.3g}–{self.high * scale:.3g} over {n} rounds)"
        )


@dataclass(frozen=True)
class Comparison:
    """Two candidates' spreads, the ratio of their medians and the sentence it supports."""

    first: str
    second: str
    ratio: float  # median of second / median of first: > 1 means first is faster (smaller)
    within_noise: bool
    sentence: str


def interleaved_rounds(
    candidates: Mapping[str, Callable[[], object]], rounds: int = 5, warmup: int = 1
) -> dict[str, Spread]:
    """Time each candidate once per round, in turn (after ``warmup`` untimed rounds); return spreads."""
    if rounds < 1:
        raise ValueError(
            f"rounds={rounds}: time at least one round (rounds=5 is the kit's default)"
        )
    for _ in range(warmup):
        for run in candidates.values():
            run()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, run in candidates.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: Spread.of(values) for name, values in samples.items()}


def min_of(run: Callable[[], object], repeats: int = 5) -> float:
    """Return the fastest of ``repeats`` timings of ``run`` (load only adds time, so the minimum is the cost)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def too_noisy(spread: Spread, limit: float = 0.5) -> bool:
    """True when the spread's width exceeds ``limit`` of its median: too wide to draw a conclusion."""
    return spread.relative_width > limit


def compare(
    first: str, a: Spread | Sequence[float], second: str, b: Spread | Sequence[float],
    *, quantity: str = "time", unit: str = "ms", scale: float = 1e3,
) -> Comparison:  # fmt: skip
    """Compare two spreads of a time (smaller is better) and write the sentence the numbers support.

    Apart ranges give "FIRST is R× faster than SECOND (medians …)"; overlapping ranges give
    "FIRST and SECOND are within this run's noise" with both ranges, never a winner. The ranges
    are written in ``unit`` (samples times ``scale``: milliseconds by default).
    """
    a = a if isinstance(a, Spread) else Spread.of(a)
    b = b if isinstance(b, Spread) else Spread.of(b)
    ratio = b.median / a.median if a.median else float("inf")
    ranges = f"{first} {a.describe(unit, scale)}, {second} {b.describe(unit, scale)}"
    if a.overlaps(b):
        sentence = f"{first} and {second} are within this run's noise on {quantity} ({ranges})"
        return Comparison(first, second, ratio, True, sentence)
    if ratio >= 1:
        sentence = f"{first} is {ratio:.2f}× faster than {second} ({ranges})"
    else:
        sentence = f"{second} is {1 / ratio:.2f}× faster than {first} ({ranges})"
    return Comparison(first, second, ratio, False, sentence)


def ranking(spreads: Mapping[str, Spread | Sequence[float]]) -> list[str]:
    """Order candidates by median time and say, for each neighbour pair, whether the gap is real or noise."""
    named = {n: s if isinstance(s, Spread) else Spread.of(s) for n, s in spreads.items()}
    order = sorted(named, key=lambda n: named[n].median)
    lines = [f"1. {order[0]}: {named[order[0]].describe()}"]
    for place, (ahead, behind) in enumerate(zip(order, order[1:], strict=False), start=2):
        gap = compare(ahead, named[ahead], behind, named[behind])
        tie = "within noise of the one above" if gap.within_noise else f"{gap.ratio:.2f}× its time"
        lines.append(f"{place}. {behind}: {named[behind].describe()} — {tie}")
    return lines


def load_line() -> str:
    """Return the machine's load beside its cores, e.g. ``'load 0.4 / 1.1 / 0.9 on 2 cores'``."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:  # Windows: no load average
        return f"load unknown on {os.cpu_count()} cores"
    return f"load {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} cores (1, 5, 15 min)"
