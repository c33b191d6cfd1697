"""The emulated link's bookkeeping, checked with chosen times and sizes instead of a clock.

test_comm_backends.py times the link on real processes, where a loaded machine only allows loose
upper bounds; these tests pin the schedule exactly, so a message charged twice (or a latency
paid per byte) fails here whatever the load.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from comm_workers.threads import run_threads

from course_lib.comm import EmulatedLink, emulate
from course_lib.comm.emulated_link import LinkClock

LINK = EmulatedLink(bandwidth=1000.0, latency=0.5)  # 1000 B/s and 0.5 s: easy arithmetic


def test_one_message_pays_transfer_and_latency_once():
    clock = LinkClock(LINK)
    leaves, arrives = clock.depart(2000, now=10.0)
    assert (leaves, arrives) == (pytest.approx(12.0), pytest.approx(12.5))  # 10 + 2000/1000
    receiver = LinkClock(LINK)
    assert receiver.arrive(2000, arrives) == pytest.approx(12.5)  # not 14.5: the sender paid
    assert LINK.transfer_time(2000) == pytest.approx(arrives - 10.0)


def test_sends_queue_behind_each_other_on_the_outgoing_side():
    clock = LinkClock(LINK)
    assert clock.depart(1000, now=0.0) == (pytest.approx(1.0), pytest.approx(1.5))
    # posted at once: starts when the first has left, not at now
    assert clock.depart(500, now=0.0) == (pytest.approx(1.5), pytest.approx(2.0))
    # posted after the side went idle: starts at now
    assert clock.depart(1000, now=5.0) == (pytest.approx(6.0), pytest.approx(6.5))


def test_receives_queue_behind_each_other_on_the_incoming_side():
    # two senders start 1000 B each at t=0 on their own links: both would arrive at 1.5
    a, b = LinkClock(LINK), LinkClock(LINK)
    (_, from_a), (_, from_b) = a.depart(1000, now=0.0), b.depart(1000, now=0.0)
    receiver = LinkClock(LINK)
    assert receiver.arrive(1000, from_a) == pytest.approx(1.5)
    assert receiver.arrive(1000, from_b) == pytest.approx(2.5)  # its bytes queue behind a's
    # an incoming side idle long enough adds nothing
    assert receiver.arrive(1000, 10.0) == pytest.approx(10.0)


def test_collective_time_follows_the_ring_and_tree_formulas():
    n, p = 8000, 4
    assert LINK.collective_time("allreduce", n, p) == pytest.approx(2 * 3 * (0.5 + 2.0))
    assert LINK.collective_time("allgather", n, p) == pytest.approx(3 * (0.5 + 2.0))
    assert LINK.collective_time("broadcast", n, p) == pytest.approx(2 * (0.5 + 8.0))
    assert LINK.collective_time("allreduce", n, 1) == 0.0
    # all_to_all: n = the bytes for the other ranks, one message to each (pairwise exchange)
    assert LINK.collective_time("all_to_all", 6000, p) == pytest.approx(3 * 0.5 + 6.0)


class _CountingClock(LinkClock):
    """A LinkClock that records every booking made through it."""

    def __init__(self, link: EmulatedLink) -> None:
        super().__init__(link)
        self.departed: list[int] = []
        self.arrived: list[int] = []

    def depart(self, nbytes: int, now: float | None = None) -> tuple[float, float]:
        self.departed.append(nbytes)
        return super().depart(nbytes, now)

    def arrive(self, nbytes: int, arrives_at: float) -> float:
        self.arrived.append(nbytes)
        return super().arrive(nbytes, arrives_at)


def test_each_message_is_booked_once_on_each_side():
    fast = EmulatedLink(bandwidth=1e12, latency=0.0)  # real bookkeeping, no waiting

    def body(comm):
        slow = emulate(comm, fast)
        slow._clock = clock = _CountingClock(fast)
        buf = np.zeros(100, np.float32)
        if comm.rank == 0:
            slow.send(buf, 1)
            slow.recv(buf, 1)
        else:
            slow.recv(buf, 0)
            slow.send(buf, 0)
        slow.sendrecv(buf, 1 - comm.rank, np.empty_like(buf), 1 - comm.rank)
        return clock.departed, clock.arrived

    for departed, arrived in run_threads(2, body):
        assert departed == [400, 400] and arrived == [400, 400]


def test_a_message_is_not_seen_before_it_arrives(monkeypatch):
    # record the waits instead of sleeping: the sender waits until its last byte left
    # (n/B after it started), the receiver exactly one latency later
    from course_lib.comm import emulated_link

    waits: list[float] = []
    monkeypatch.setattr(emulated_link, "sleep_until", waits.append)

    def body(comm):
        slow = emulate(comm, LINK)
        buf = np.zeros(250, np.float32)  # 1000 bytes: 1 s on the link, then 0.5 s latency
        if comm.rank == 1:
            slow.recv(buf, 0)
            return None
        before = time.time()
        slow.send(buf, 1)
        return before, time.time()

    (before, after), _ = run_threads(2, body)
    sender_wait, receiver_wait = sorted(waits)
    assert before + 1.0 <= sender_wait <= after + 1.0
    assert receiver_wait == pytest.approx(sender_wait + 0.5, abs=1e-6)  # header: ns resolution
