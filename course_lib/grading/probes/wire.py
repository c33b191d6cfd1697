"""No lecture (the grader). The ranks' byte counts held against the bytes the Linux kernel saw on the wire.

An exercise judged on who talked to whom and how many bytes (A2's halving and doubling, ...)
is judged on the counts its ranks return, and those are counted in the student's processes. The
grader therefore also counts the bytes itself, outside the sandbox, at the sockets
(:mod:`course_lib.grading.wire_audit`, recorded by nbval around the probe cell), and asks that
the two agree: every pair of ranks must have carried at least the payload the ranks reported,
and no more than that plus the transport's framing for the messages reported, so an answer that
rewrites its counters, sends what it does not report, or calls a built-in collective it hides,
fails with the pair and both figures named.

The probe cell's kernel code ends with one line naming each rank's process (the engines' PIDs,
ordered by rank): the answer could change that line too, but only to another labelling of the
same processes, since each rank's own traffic must still match what that rank reported.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "AGREE_LEAST",
    "AGREE_MOST",
    "BARRIER_LEAST",
    "BARRIER_MOST",
    "PIDS_CODE",
    "PIDS_MARK",
    "RING_ACK",
    "RING_MESSAGE",
    "UNACCOUNTED_MOST",
    "Claims",
    "ClaimsBuilder",
    "counter_claims",
    "decode_pids",
    "p2p_claims",
    "wire_problem",
]

PIDS_MARK = "COURSE-PIDS:"

#: Kernel code (indented 4, inside the probe function) printing the engines' PIDs by rank.
PIDS_CODE = f"""\
    try:
        import os as _os
        print("{PIDS_MARK}" + json.dumps([int(p) for p in cluster.run(_os.getpid, timeout=20)]))
    except Exception:
        pass
"""

#: What gloo and the kit's header add to each point-to-point message: measured at 224 B from
#: the sender and 96 B back from the receiver (any size, 3 and 4 engines, bench/bench_wire_framing.py),
#: exactly; 8 B of headroom.
PER_MESSAGE_SENT, PER_MESSAGE_RECEIVED = 232, 104
#: A pair's allowance beyond that, for an exercise whose probe makes no new communicator.
PER_PAIR = 64

#: What a barrier puts on each pair, at least and at most: its agreement header (5 int64) to every
#: peer, and gloo's own barrier; measured at 184-384 B a pair (2, 3 and 4 engines).
BARRIER_LEAST, BARRIER_MOST = 40, 400

#: Bytes that may cross the loopback outside the sockets open at the end of a probe cell: none
#: did in a right answer's cells on a quiet machine, 12-48 B with both cores busy (TCP options,
#: SACK blocks, that the count cannot tell from payload); the rest went over a connection that
#: closed during the cell, or not over TCP.
UNACCOUNTED_MOST = 4096

#: What the kit's agreement before a built-in collective (its header, 5 int64, to every peer)
#: puts on each pair, each way: measured 184 B a call at every size and collective.
AGREE_LEAST, AGREE_MOST = 40, 200

#: gloo's rings, per message from the sender and back from the receiver: measured 192 B and 96 B
#: beyond the chunk (bench/bench_wire_framing.py); 8 B of headroom. Its broadcast's tree: 96 B
#: and 48 B (measured), the same allowed.
RING_MESSAGE, RING_ACK = 200, 104
#: A ring's chunk may be an element longer or shorter than N / p: 8 B a message either way.
RING_ROUNDING = 8
#: Which neighbour gloo's ring sends to: allreduce (and the kit's reduce-scatter, an allreduce
#: sliced) to rank r - 1, allgather to rank r + 1 (measured). The other way round is allowed
#: too, so a gloo that turned its rings round would not cost an honest answer its points.
_RING_DIRECTION = {"allreduce": -1, "reduce_scatter": -1, "allgather": +1}
#: The communicator's built-ins: a report naming another one is not the communicator's.
_BUILTINS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier")

#: (sender, receiver) -> (payload bytes, messages, bytes allowed beyond them: barriers)
Claims = Mapping[tuple[int, int], tuple[int, int, int]]


class ClaimsBuilder:
    """Sums what the ranks reported, case by case, into :data:`Claims`."""

    def __init__(self) -> None:
        self.claims: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._rings: list[tuple[int, int, str, int, int]] = []

    def _add(self, rank: int, peer: int, least: int, messages: int, extra: int) -> None:
        if min(rank, peer, least, messages, extra) < 0:  # a report can be forged: no credit
            raise ValueError(f"rank {rank} reported a negative count for rank {peer}")
        old = self.claims.get((rank, peer), (0, 0, 0))
        self.claims[(rank, peer)] = (old[0] + least, old[1] + messages, old[2] + extra)

    def sent(self, rank: int, peer: int, nbytes: int, messages: int) -> None:
        """Rank ``rank`` reported ``messages`` messages of ``nbytes`` bytes in all to ``peer``."""
        self._add(rank, peer, nbytes, messages, 0)

    def barriers(self, rank: int, world_size: int, calls: int) -> None:
        """Rank ``rank`` reported ``calls`` barriers: each must be on every pair, within bounds.

        A barrier claimed but not called is short of its least bytes on some pair; the most
        lets a claimed barrier cover a few hundred bytes of other traffic, no more.
        """
        least, spread = BARRIER_LEAST * calls, (BARRIER_MOST - BARRIER_LEAST) * calls
        for peer in range(world_size):
            if peer != rank:
                self._add(rank, peer, least, 0, spread)

    def counts(
        self,
        rank: int,
        world_size: int,
        used: Iterable,
        p2p: Any,
        broadcast_root: int | None = None,
    ) -> None:
        """Rank ``rank``'s counts as ``comm.stats.as_rows()`` gives them: the built-ins
        [(name, calls, bytes)] and rows of (peer, messages sent, bytes sent, messages received,
        bytes received)."""
        for peer, messages, nbytes, _got, _received in np.asarray(p2p, np.int64).reshape(-1, 5):
            self.sent(rank, int(peer), int(nbytes), int(messages))
        self.builtins(rank, world_size, used, broadcast_root)

    def training_run(self, counters: Sequence) -> None:
        """A data-parallel run's counts (``DataParallelResult.counters``): each rank's set-up
        (the broadcast of rank 0's weights, the method's attaching) and steps, by rank."""
        for rank, (setup, steps) in enumerate(counters):
            for used, p2p in (setup, steps):
                self.counts(rank, len(counters), used, p2p, broadcast_root=0)

    def builtins(
        self, rank: int, world_size: int, used: Iterable, broadcast_root: int | None = None
    ) -> None:
        """Rank ``rank`` reported the built-in collectives ``used``: [(name, calls, bytes)].

        Every call sends its agreement to every peer; the ring collectives (allreduce,
        reduce-scatter, allgather) add gloo's ring, whose direction is settled in
        :meth:`alternatives`; a broadcast, gloo's binomial tree from ``broadcast_root`` (the
        counters do not say the root: without one, a broadcast claims nothing, so its bytes
        count as unreported).
        """
        for name, calls, nbytes in used:
            name, calls, nbytes = str(name), int(calls), int(nbytes)
            if name not in _BUILTINS or min(calls, nbytes) < 0:
                raise ValueError(f"rank {rank} reported {calls} calls of {name!r}, {nbytes} bytes")
            if name == "barrier":
                self.barriers(rank, world_size, calls)
                continue
            modelled = name in _RING_DIRECTION or (
                name == "broadcast" and broadcast_root is not None
            )
            if not modelled or world_size < 2 or calls < 1:
                continue
            for peer in range(world_size):
                if peer != rank:
                    self._add(rank, peer, AGREE_LEAST * calls, 0, AGREE_MOST * calls)
            if name == "broadcast":
                self._tree(rank, world_size, calls, nbytes, int(broadcast_root))
            else:
                self._rings.append((rank, world_size, name, calls, nbytes))

    def _tree(self, rank: int, p: int, calls: int, nbytes: int, root: int) -> None:
        """A broadcast down gloo's binomial tree: relative rank v sends to v + 2^k for every
        2^k > v (measured on 3 and 4 engines from rank 0: 0 -> 1, 0 -> 2, 1 -> 3), acknowledged."""
        v = (rank - root) % p
        step = 1  # the least power of two above v: v's children are v + step, v + 2 step, ...
        while step <= v:
            step *= 2
        child = v + step
        while child < p:
            self._add(rank, (child + root) % p, nbytes, 0, RING_MESSAGE * calls)
            child += child - v
        if v > 0:  # its parent: v less the greatest power of two in it
            self._add(rank, (v - step // 2 + root) % p, 0, 0, RING_ACK * calls)

    def _ring(self, claims: ClaimsBuilder, ring: tuple, direction: int) -> None:
        """Add one rank's ring traffic, sent towards ``rank + direction``, to ``claims``."""
        rank, p, name, calls, nbytes = ring
        if name == "allgather":  # every rank's whole buffer passes each link once
            messages, payload, rounding = (p - 1) * calls, (p - 1) * nbytes, 0
        else:  # reduce-scatter then allgather, a chunk of N / p a message
            messages = 2 * (p - 1) * calls
            payload, rounding = 2 * (p - 1) * nbytes // p, RING_ROUNDING * messages
        least, spread = max(0, payload - rounding), 2 * rounding + RING_MESSAGE * messages
        claims._add(rank, (rank + direction) % p, least, 0, spread)
        claims._add(rank, (rank - direction) % p, 0, 0, RING_ACK * messages)

    def alternatives(self) -> list[Claims]:
        """The claims, once per direction gloo's rings could take (the measured one first)."""
        families = sorted({_RING_DIRECTION[name] for _, _, name, _, _ in self._rings})
        out: list[Claims] = []
        for flips in itertools.product((1, -1), repeat=len(families)):
            turned = dict(zip(families, flips, strict=True))
            claims = ClaimsBuilder()
            claims.claims = dict(self.claims)
            for ring in self._rings:
                direction = _RING_DIRECTION[ring[2]]
                self._ring(claims, ring, direction * turned[direction])
            out.append(claims.claims)
        return out


def counter_claims(
    cases: list, counters: Callable[[Any], Iterable[tuple[Any, Any]]]
) -> list[Claims]:
    """Claims from cases whose ranks each return (rank, world size, data); ``counters(data)``
    gives the (built-ins [(name, calls, bytes)], rows of (peer, messages sent, bytes sent,
    messages received, bytes received)) that data holds: the shape of A6's and A7's collectors."""
    claims = ClaimsBuilder()
    for ranks in cases:
        for rank, world_size, data in ranks:
            for used, p2p in counters(data):
                claims.counts(int(rank), int(world_size), used, p2p)
    return claims.alternatives()


def p2p_claims(cases: list, used_at: int, p2p_at: int) -> list[Claims]:
    """:func:`counter_claims` for data holding the built-ins at ``used_at``, the rows at ``p2p_at``."""
    return counter_claims(cases, lambda data: [(data[used_at], data[p2p_at])])


def decode_pids(stdout: str) -> list[int] | None:
    """The engines' PIDs by rank, from the probe's last ``COURSE-PIDS:`` line (None if absent)."""
    lines = [line for line in stdout.splitlines() if line.startswith(PIDS_MARK)]
    try:
        pids = json.loads(lines[-1][len(PIDS_MARK) :]) if lines else None
    except ValueError:
        return None
    if not isinstance(pids, list) or not all(isinstance(p, int) and p > 0 for p in pids):
        return None
    return pids if len(set(pids)) == len(pids) else None


def _measured(record: Mapping[str, Any], pids: list[int]) -> dict[tuple[int, int], int]:
    """Bytes between ranks on the wire: each socket's owner traced up to the rank that started it."""
    rank_of = {pid: rank for rank, pid in enumerate(pids)}
    out: dict[tuple[int, int], int] = {}
    for sender, receiver, nbytes in record.get("flows", []):
        a = next((rank_of[p] for p in sender if p in rank_of), None)
        b = next((rank_of[p] for p in receiver if p in rank_of), None)
        if a is not None and b is not None and a != b:
            out[(a, b)] = out.get((a, b), 0) + int(nbytes)
    return out


def wire_problem(
    claims: Claims | Sequence[Claims],
    record: Mapping[str, Any] | None,
    stdout: str,
    slack: int = PER_PAIR,
) -> str | None:
    """Why the ranks' reported bytes disagree with the wire (None when they agree).

    ``claims``: one set, or alternatives (:meth:`ClaimsBuilder.alternatives`): the wire must
    agree with one of them, and the first one's disagreement is named. ``slack``: bytes a pair
    may carry beyond the payload reported and its framing (connecting a subgroup costs a few
    hundred bytes per pair, over the rendezvous store at rank 0).
    """
    if record is None:
        return None  # not audited (no sandbox, or not root): the ranks' counts stand alone
    if "error" in record:
        return f"the grader could not count the bytes on the wire: {record['error']}"
    hidden = int(record.get("unaccounted", 0))
    if hidden > max(slack, UNACCOUNTED_MOST):
        return (
            f"{hidden} bytes crossed the sandbox's network outside the connections open at the "
            "end (a connection closed during the probe, or not TCP), so the ranks' counts "
            "cannot be checked: keep to the communicator"
        )
    pids = decode_pids(stdout)
    if pids is None:
        return "the engines' process ids never reached the grader, so the bytes cannot be checked"
    measured = _measured(record, pids)
    options = [claims] if isinstance(claims, Mapping) else list(claims) or [{}]
    problems = [_disagreement(option, measured, slack) for option in options]
    return None if None in problems else problems[0]


def _disagreement(
    claims: Claims, measured: Mapping[tuple[int, int], int], slack: int
) -> str | None:
    """The first pair of ranks whose bytes on the wire the claims do not explain (None: all do)."""
    for a, b in sorted(set(claims) | set(measured)):
        said, messages, extra = claims.get((a, b), (0, 0, 0))
        replies = claims.get((b, a), (0, 0, 0))[1]
        seen = measured.get((a, b), 0)
        most = said + PER_MESSAGE_SENT * messages + PER_MESSAGE_RECEIVED * replies + extra + slack
        if not said <= seen <= most:
            return (
                f"rank {a} sent rank {b} {seen} bytes on the wire, but the ranks reported "
                f"{said} bytes{f' in {messages} messages' if messages else ''} (at most {most} "
                "with the transport's framing): the communicator's counts were changed, or "
                "traffic went around them"
            )
    return None
