"""No lecture (the grader). What the ranks' counts say the wire must carry: gloo's framing, rings and trees.

A rank reports its point-to-point messages per peer and the built-in collectives it called
(``comm.stats.as_rows()``). :class:`ClaimsBuilder` turns those reports into, for every pair of
ranks, the least payload the pair must have carried and the most it may carry beyond it: the
framing of each message, the kit's agreement before each built-in, gloo's rings (allreduce,
allgather) and binomial tree (broadcast), barriers. Every figure was measured
(``bench/bench_wire_framing.py``); :mod:`course_grader.verdict.wire` holds the counts of the
wire against them. Reports that cannot be true (negative counts, a built-in the communicator
does not have) raise ValueError: they come from the answer's process.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "AGREE_LEAST",
    "AGREE_MOST",
    "BARRIER_LEAST",
    "BARRIER_MOST",
    "PER_MESSAGE_RECEIVED",
    "PER_MESSAGE_SENT",
    "PER_PAIR",
    "RING_ACK",
    "RING_MESSAGE",
    "MAX_COUNT",
    "MAX_RANKS",
    "Claims",
    "ClaimsBuilder",
    "count",
    "counter_claims",
    "p2p_claims",
]

#: What gloo and the kit's header add to each point-to-point message: measured at 224 B from
#: the sender and 96 B back from the receiver (any size, 3 and 4 engines, bench/bench_wire_framing.py),
#: exactly; 8 B of headroom.
PER_MESSAGE_SENT, PER_MESSAGE_RECEIVED = 232, 104
#: A pair's allowance beyond that, for an exercise whose probe makes no new communicator.
PER_PAIR = 64

#: What a barrier puts on each pair, at least and at most: its agreement header (5 int64) to every
#: peer, and gloo's own barrier; measured at 184-384 B a pair (2, 3 and 4 engines).
BARRIER_LEAST, BARRIER_MOST = 40, 400

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

#: The most ranks a report may name (the course's probes run 2-4 engines), and the largest count
#: it may give: a report beyond either comes from a forged counter, and would make the grader
#: loop over ranks or allow room for hidden bytes.
MAX_RANKS, MAX_COUNT = 256, 2**40


def count(value: Any, what: str = "a count", most: int = MAX_COUNT) -> int:
    """``value`` as an int in [0, most]; ValueError for anything else (inf, nan, 2.5, "3", -1).

    The ranks' reports come from the answer's process: a non-finite or fractional number, or
    one out of range, is refused before the grader counts, loops or allocates with it.
    """
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is not a number ({type(value).__name__})")
    if isinstance(value, float) and not (value == value and abs(value) != float("inf")):
        raise ValueError(f"{what} is not finite ({value})")
    if value != int(value) or not 0 <= int(value) <= most:
        raise ValueError(f"{what} is {value}, not a whole number from 0 to {most}")
    return int(value)


class ClaimsBuilder:
    """Sums what the ranks reported, case by case, into :data:`Claims`."""

    def __init__(self) -> None:
        self.claims: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._rings: list[tuple[int, int, str, int, int]] = []

    def _add(self, rank: int, peer: int, least: int, messages: int, extra: int) -> None:
        if min(rank, peer, least, messages, extra) < 0:  # a report can be forged: no credit
            raise ValueError(f"rank {rank} reported a negative count for rank {peer}")
        rank, peer = count(rank, "a rank", MAX_RANKS - 1), count(peer, "a peer", MAX_RANKS - 1)
        least, messages = count(least, "a byte count"), count(messages, "a message count")
        extra = count(extra, "an allowance")
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
        world_size = count(world_size, "a world size", MAX_RANKS)
        calls = count(calls, "a barrier count")
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
        rows = np.asarray(p2p)
        if rows.dtype.kind not in "biuf" or rows.size > 5 * MAX_RANKS:
            raise ValueError(f"rank {rank}'s rows of peers are not {MAX_RANKS} rows of numbers")
        for peer, messages, nbytes, _got, _received in rows.reshape(-1, 5):
            self.sent(rank, count(peer, "a peer"), count(nbytes), count(messages))
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
        world_size = count(world_size, "a world size", MAX_RANKS)
        for name, calls, nbytes in used:
            name = str(name)[:40]
            if name not in _BUILTINS:
                raise ValueError(f"rank {rank} reported calls of {name!r}")
            try:
                calls, nbytes = count(calls, "a call count"), count(nbytes, "a byte count")
            except ValueError as exc:
                raise ValueError(f"rank {rank} reported {name!r} with {exc}") from None
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
                root = count(broadcast_root, "a root", world_size - 1)
                self._tree(rank, world_size, calls, nbytes, root)
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
