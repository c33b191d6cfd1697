"""Lecture 3: Counters of messages, bytes and seconds, per peer and per built-in collective."""

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
    """Calls of one built-in collective and the buffer bytes handed to it."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0


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

    def as_dict(self) -> dict:
        """Return plain dicts (easy to send back from an engine and print)."""
        return {
            "peers": {r: vars(p).copy() for r, p in sorted(self.peers.items())},
            "collectives": {n: vars(c).copy() for n, c in self.collectives.items()},
        }
