"""Lecture 3: Emulate a slower network link on top of a real communicator, so one laptop behaves like a lab room.

:func:`emulate` returns a view of a communicator whose class puts :class:`EmulatedCommunicator`
in front of the backend's: it overrides the communicator's clock hooks with a :class:`LinkClock`
per rank, and everything else (transport, collectives, counters) is the backend's own.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any

from course_lib.comm.communicator import Communicator

__all__ = ["GIGABIT", "EmulatedCommunicator", "EmulatedLink", "LinkClock", "emulate", "sleep_until"]


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
        if name == "all_to_all":  # nbytes = the blocks for other ranks, one message to each
            return (p - 1) * a + nbytes * b
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


class EmulatedCommunicator(Communicator):
    """Mix-in in front of a backend's communicator class: every message pays the link's time.

    Sends book the rank's outgoing side and carry their arrival time in the header; receives
    book the incoming side; a built-in collective pays the link's time for its algorithm after
    the real collective, not overlapped with it: the real part is every rank arriving plus this
    machine's per-step software latency, which a real network pays on top of its wire time (as
    the kit's point-to-point algorithms do, step by step). That overstates by the loopback
    transfer, about 1 ms per 2 MB.
    """

    link: EmulatedLink
    _clock: LinkClock
    _real_class: type

    def _depart(self, nbytes: int) -> tuple[float, float]:
        """Book the outgoing side; return (when the last byte leaves, when it arrives)."""
        return self._clock.depart(nbytes)

    def _arrive(self, nbytes: int, arrives_at: float) -> float:
        """Book the incoming side; return when the receiver may see the message."""
        return self._clock.arrive(nbytes, arrives_at)

    def _wait_for_link(self, until: float) -> None:
        """Sleep until the emulated link is done."""
        sleep_until(until)

    def _after_collective(self, name: str, nbytes: int) -> None:
        """Sleep for the link's time of a built-in collective of ``nbytes``."""
        sleep_until(time.time() + self.link.collective_time(name, nbytes, self.world_size))

    @property
    def emulated(self) -> bool:
        """True: timings through this communicator come from the emulated link."""
        return True

    @property
    def label(self) -> str:
        """Return e.g. ``"gloo, 4 ranks, emulated link 1000 Mbit/s ..."`` for plots and tables."""
        return f"{self.backend}, {self.world_size} ranks, {self.link.label}"

    def subgroup(self, ranks: Any) -> Communicator | None:
        """Return the sub-communicator over ``ranks``, slowed to the same link."""
        sub = self._real_class.subgroup(self, ranks)
        return emulate(sub, self.link) if sub is not None else None


_EMULATED_CLASSES: dict[type, type] = {}


def _emulated_class(real: type) -> type:
    """Return the class ``Emulated<Backend>``: the mix-in in front of ``real`` (made once)."""
    if real not in _EMULATED_CLASSES:
        bases, body = (EmulatedCommunicator, real), {"__module__": __name__}
        _EMULATED_CLASSES[real] = type(f"Emulated{real.__name__}", bases, body)
    return _EMULATED_CLASSES[real]


def emulate(comm: Communicator, link: EmulatedLink | None = None) -> Communicator:
    """Return a view of ``comm`` whose traffic is slowed to ``link`` (default: Gigabit Ethernet).

    The returned communicator shares the real connection with ``comm`` but has its own counters;
    its ``emulated`` property is True and ``label`` says so, so every number measured through it
    can be printed as emulated. Every rank must wrap its communicator with the same link.
    """
    real = getattr(comm, "_real_class", type(comm))  # emulating an emulated view: replace its link
    view = copy.copy(comm)
    view.__class__ = _emulated_class(real)
    view._real_class = real
    view.link = link if link is not None else GIGABIT
    view._clock = LinkClock(view.link)
    view.stats = type(comm.stats)()
    return view
