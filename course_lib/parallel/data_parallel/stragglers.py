"""Lectures 4-5: Slow one engine down on purpose, to show who waits for whom.

A lab's PCs are rarely equal: one is older, one is busy with something else. Bulk-synchronous
training waits for the slowest rank every step; Local-SGD waits every ``p`` steps; an
asynchronous parameter server never waits (Dean et al. 2012; Ho et al. 2013 for the
stale-synchronous middle ground). To show it on a laptop whose engines are all alike, a rank is
made slower by sleeping after its compute:

::

    parse_stragglers({2: 0.5})                    # rank 2 runs at half speed
    parse_stragglers({1: Straggler(delay=0.05)})  # rank 1 loses 50 ms every step

The sleep is an emulation, and every figure measured with it says so.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Straggler", "parse_stragglers", "slow_down"]


@dataclass(frozen=True)
class Straggler:
    """How much slower one rank is: ``speed`` (fraction of normal, 0 < speed <= 1) and a fixed ``delay``.

    A step whose compute took ``c`` seconds is stretched to ``c / speed + delay`` seconds.
    """

    speed: float = 1.0
    delay: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.speed <= 1.0:
            raise ValueError(
                f"straggler speed={self.speed}: give the fraction of normal speed, "
                "0 < speed <= 1 (0.5 = half speed); for a fixed pause use delay=seconds"
            )
        if self.delay < 0:
            raise ValueError(f"straggler delay={self.delay}: give seconds per step, >= 0")

    def extra_seconds(self, compute_seconds: float) -> float:
        """Return how long to sleep after a compute phase of ``compute_seconds``."""
        return compute_seconds * (1.0 / self.speed - 1.0) + self.delay


def parse_stragglers(
    spec: Mapping[int, float | Straggler] | None, world_size: int | None = None
) -> dict[int, Straggler]:
    """Return ``{rank: Straggler}`` from ``{rank: speed fraction or Straggler}``; validate ranks."""
    if not spec:
        return {}
    if not isinstance(spec, Mapping):
        raise TypeError(
            f"stragglers={spec!r}: give a dict {{rank: speed}}, e.g. {{1: 0.5}} for rank 1 at "
            "half speed, or {1: Straggler(delay=0.05)}"
        )
    out: dict[int, Straggler] = {}
    for rank, how in spec.items():
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"stragglers: {rank!r} is not a rank (an int >= 0)")
        if world_size is not None and rank >= world_size:
            raise ValueError(
                f"stragglers: rank {rank} does not exist in a world of {world_size} "
                f"(ranks 0..{world_size - 1})"
            )
        out[rank] = how if isinstance(how, Straggler) else Straggler(speed=float(how))
    return out


def slow_down(straggler: Straggler | None, compute_seconds: float) -> float:
    """Sleep as a straggler would after ``compute_seconds`` of compute; return seconds slept."""
    if straggler is None:
        return 0.0
    extra = straggler.extra_seconds(compute_seconds)
    if extra > 0:
        time.sleep(extra)
    return extra
