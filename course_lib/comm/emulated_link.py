"""Lecture 3: Emulate a slower network link on top of a real communicator, so one laptop behaves like a lab room."""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from course_lib.comm.communicator import Communicator

__all__ = ["GIGABIT", "EmulatedLink", "LinkClock", "emulate", "sleep_until"]


@dataclass(frozen=True)
class EmulatedLink:
    """A full-duplex link: every message takes at least ``latency + nbytes / bandwidth`` seconds.

    Defaults are Gigabit Ethernet (125 MB/s, source 000's lab room) with a 50 us one-way latency,
    typical of a switched office LAN. Each rank has one such link: its sends are serialised on the
    outgoing side and its receives on the incoming side, so a parameter server that receives from
    N-1 workers at once pays N-1 transfer times, as on a real network card.
    """

    bandwidth: float = 125e6  # bytes per second
    latency: float = 50e-6  # seconds, one way

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(
                f"bandwidth must be a positive number of bytes/s, got {self.bandwidth}"
            )
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise ValueError(f"latency must be >= 0 seconds, got {self.latency}")

    def transfer_time(self, nbytes: int) -> float:
        """Return the emulated time of one message: $\\alpha + n / B$."""
        return self.latency + nbytes / self.bandwidth

    def collective_time(self, name: str, nbytes: int, world_size: int) -> float:
        """Return the least time a built-in collective takes on this link (ring / tree costs).

        The backend's own algorithm runs on the real (fast) link; afterwards each rank waits out
        the time a bandwidth-optimal algorithm would need on the emulated link, on top of the
        real time (every rank arriving and the software's per-step latency, which a real
        network adds to its wire time too).
        """
        p, a, b = world_size, self.latency, 1.0 / self.bandwidth
        if p <= 1:
            return 0.0
        if name == "allreduce":
            return 2 * (p - 1) * (a + nbytes / p * b)
        if name in ("allgather", "reduce_scatter"):  # nbytes = the whole (gathered) buffer
            return (p - 1) * (a + nbytes / p * b)
        if name == "broadcast":
            return math.ceil(math.log2(p)) * (a + nbytes * b)
        return 2 * math.ceil(math.log2(p)) * a  # barrier

    @property
    def label(self) -> str:
        """Return the text that plots and benchmarks print next to emulated numbers."""
        mbit = self.bandwidth * 8 / 1e6
        return f"emulated link {mbit:g} Mbit/s ({self.bandwidth / 1e6:g} MB/s), {self.latency * 1e6:g} us"


GIGABIT = EmulatedLink()


class LinkClock:
    """The emulated network card of one rank: when its outgoing and incoming sides are free."""

    def __init__(self, link: EmulatedLink) -> None:
        self.link = link
        self.out_free_at = 0.0
        self.in_free_at = 0.0

    def depart(self, nbytes: int, now: float | None = None) -> tuple[float, float]:
        """Book the outgoing side; return (time the last byte leaves, time it arrives).

        The message starts once the outgoing side is free, so it leaves at
        ``max(now, previous leave) + nbytes / bandwidth`` and arrives ``latency`` later. ``now``
        defaults to ``time.time()``; tests pass it to check the bookkeeping without a clock.
        """
        start = max(time.time() if now is None else now, self.out_free_at)
        leaves = start + nbytes / self.link.bandwidth
        self.out_free_at = leaves
        return leaves, leaves + self.link.latency

    def arrive(self, nbytes: int, arrives_at: float) -> float:
        """Book the incoming side for a message; return when the receiver may see it.

        Its bytes hold the incoming side for ``nbytes / bandwidth`` up to ``arrives_at``, or
        later while an earlier message still holds it: ``max(arrives_at, previous ready +
        nbytes / bandwidth)``. The sender already paid the transfer time; it is not added again.
        """
        ready = max(arrives_at, self.in_free_at + nbytes / self.link.bandwidth)
        self.in_free_at = ready
        return ready


def sleep_until(deadline: float) -> None:
    """Wait until ``time.time()`` reaches ``deadline``: sleep, then spin the last 0.3 ms."""
    # time.sleep overshoots by ~0.1 ms on Linux; spinning at the end keeps small latencies exact.
    remaining = deadline - time.time()
    if remaining > 3e-4:
        time.sleep(remaining - 3e-4)
    while time.time() < deadline:
        pass


def emulate(comm: Communicator, link: EmulatedLink | None = None) -> Communicator:
    """Return a view of ``comm`` whose traffic is slowed to ``link`` (default: Gigabit Ethernet).

    The returned communicator shares the real connection with ``comm`` but has its own counters;
    its ``emulated`` property is True and ``label`` says so, so every number measured through it
    can be printed as emulated. Every rank must wrap its communicator with the same link.
    """
    view = copy.copy(comm)
    view.link = link if link is not None else GIGABIT
    view._clock = LinkClock(view.link)
    view.stats = type(comm.stats)()
    return view
