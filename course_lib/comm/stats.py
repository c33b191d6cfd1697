"""Lecture 3: Counters of messages, bytes and seconds, per peer and per built-in collective.

Point-to-point bytes are what a rank put on the wire; a built-in collective's bytes are the
buffer handed to it, which its algorithm moves several times or in parts:
:func:`course_lib.comm.wire.wire_bytes` turns both into the bytes on this rank's link.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CollectiveStats", "CommStats", "PeerStats"]


@dataclass
class PeerStats:
    """Point-to-point traffic with one peer; bytes are payload bytes (the 32-byte header is not counted)."""

    messages_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0
    seconds: float = 0.0  # from posting to completion, for each message with this peer


@dataclass
class CollectiveStats:
    """Calls of one built-in collective and the buffer bytes handed to it (not its wire bytes).

    ``sizes`` counts the calls per buffer size: a backend picks its algorithm by size (MPICH's
    allreduce: recursive doubling up to 2 KiB), so the wire bytes need each call's size.
    """

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0
    sizes: dict[int, int] = field(default_factory=dict)

    def add(self, nbytes: int, seconds: float = 0.0) -> None:
        """Count one call that was handed ``nbytes`` and took ``seconds``."""
        self.calls += 1
        self.bytes += nbytes
        self.seconds += seconds
        self.sizes[nbytes] = self.sizes.get(nbytes, 0) + 1


@dataclass
class CommStats:
    """All counters of one communicator; ``reset()`` before a measurement."""

    peers: dict[int, PeerStats] = field(default_factory=dict)
    collectives: dict[str, CollectiveStats] = field(default_factory=dict)

    def peer(self, rank: int) -> PeerStats:
        """Return the counters for ``rank``, creating them on first use."""
        return self.peers.setdefault(rank, PeerStats())

    def collective(self, name: str) -> CollectiveStats:
        """Return the counters for the built-in collective ``name``."""
        return self.collectives.setdefault(name, CollectiveStats())

    @property
    def bytes_sent(self) -> int:
        """Total payload bytes sent point-to-point."""
        return sum(p.bytes_sent for p in self.peers.values())

    @property
    def bytes_received(self) -> int:
        """Total payload bytes received point-to-point."""
        return sum(p.bytes_received for p in self.peers.values())

    @property
    def messages_sent(self) -> int:
        """Total point-to-point messages sent."""
        return sum(p.messages_sent for p in self.peers.values())

    def reset(self) -> None:
        """Set every counter back to zero."""
        self.peers.clear()
        self.collectives.clear()

    def as_rows(self) -> tuple[list[tuple[str, int, int]], list[tuple[int, int, int, int, int]]]:
        """Return the counts as rows of numbers: the built-ins [(name, calls, bytes)] and the
        peers [(peer, messages sent, bytes sent, messages received, bytes received)]."""
        used = [(str(n), c.calls, c.bytes) for n, c in sorted(self.collectives.items())]
        peers = [
            (int(r), p.messages_sent, p.bytes_sent, p.messages_received, p.bytes_received)
            for r, p in sorted(self.peers.items())
            if p.messages_sent or p.messages_received
        ]
        return used, peers

    def as_dict(self) -> dict:
        """Return plain dicts (easy to send back from an engine and print)."""
        return {
            "peers": {r: vars(p).copy() for r, p in sorted(self.peers.items())},
            "collectives": {
                n: {**vars(c), "sizes": dict(c.sizes)} for n, c in self.collectives.items()
            },
        }
