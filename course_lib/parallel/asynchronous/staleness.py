"""Lecture 5: The asynchronous server's bookkeeping, without any engine: versions, clocks, staleness, the SSP gate.

An asynchronous parameter server (Dean et al. 2012, "Downpour SGD") applies each worker's
gradient the moment it arrives. A gradient computed on the weights of version ``v`` and applied
when the server is at version ``V`` is ``V - v`` updates old: its **staleness** (the delay
``tau`` of the asynchronous-SGD analyses).

Stale-synchronous parallel (SSP, Ho et al. 2013) bounds how far the workers may drift apart:
each worker's **clock** counts its applied gradients, and a worker whose clock is more than
``s`` ahead of the slowest live worker's is not given new weights until the slowest catches up.
So when a worker reads, ``its clock - slowest clock <= s`` (its **clock lag**): every update of
the first ``clock - s`` iterations of every worker is in the weights it reads. ``s = 0`` is the
bulk-synchronous order (nobody starts iteration ``c + 1`` before everybody finished ``c``);
``s = None`` never holds anyone back (fully asynchronous).

The bound is on clocks; in updates it means, with ``W`` live workers, a staleness of at most
``(W - 1)(2s + 1)``: while a worker computes, each other worker can apply at most ``2s + 1``
gradients (it started at least ``s`` behind and stops ``s + 1`` ahead). :func:`staleness_limit`
returns it.

::

    ledger = StalenessLedger([1, 2], bound=1)
    ledger.start()                 # [1, 2]: both read version 0
    ledger.arrive(1, version_used=0)   # applied at version 0: staleness 0; worker 1 waits
    ledger.release()               # [1]: clock 1 - slowest 0 <= 1, so worker 1 reads version 1
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AppliedGradient", "StalenessLedger", "staleness_limit", "validate_bound"]


def validate_bound(bound: int | None) -> int | None:
    """Return ``bound`` if it is None (asynchronous) or an int >= 0; raise ValueError with advice."""
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
        raise ValueError(
            f"staleness_bound={bound!r}: give a whole number of steps >= 0 (0 = bulk-synchronous "
            "order, 1 or 2 = stale-synchronous) or None for fully asynchronous"
        )
    return bound


def staleness_limit(bound: int | None, workers: int) -> int | None:
    """Return the most updates a gradient can be old under SSP with ``workers`` live workers.

    ``None`` when there is no bound (asynchronous: staleness grows with the speed difference).
    """
    return None if bound is None else max(workers - 1, 0) * (2 * bound + 1)


@dataclass(frozen=True)
class AppliedGradient:
    """One gradient the server applied: whose, computed on which version, applied on which."""

    worker: int
    step: int  # the worker's clock before this gradient: 0 for its first
    version_used: int  # the server version of the weights the worker computed it on
    applied_at: int  # the server version it was applied to (the new version is this + 1)
    staleness: int  # applied_at - version_used: updates applied since the worker read
    clock_lag: int  # the worker's clock minus the slowest live worker's, when it read


class StalenessLedger:
    """The server's state between messages: version, clocks, who computes, who waits, the gate.

    A worker is in one of three states: *computing* (it read weights and owes a gradient),
    *waiting* (its gradient was applied; the reply is held back by the SSP gate) or gone
    (dropped: dead, or finished). Every method is a pure state change, so a scripted order of
    arrivals can be replayed without engines; the server loop drives the same object.
    """

    def __init__(self, workers: list[int], bound: int | None = None) -> None:
        if not workers or len(set(workers)) != len(workers):
            raise ValueError(f"workers must be distinct ids, at least one, got {workers}")
        self.bound = validate_bound(bound)
        self.version = 0
        self.clocks = {w: 0 for w in workers}
        self.live = set(workers)
        self.computing: dict[int, tuple[int, int]] = {}  # worker -> (version read, clock lag)
        self.waiting: list[int] = []  # in arrival order
        self.applied: list[AppliedGradient] = []

    def slowest(self) -> int:
        """Return the smallest clock among the live workers (0 when none is left)."""
        return min((self.clocks[w] for w in self.live), default=0)

    def may_proceed(self, worker: int) -> bool:
        """Return True when ``worker`` may read new weights now (the SSP gate)."""
        return self.bound is None or self.clocks[worker] - self.slowest() <= self.bound

    def _read(self, worker: int) -> None:
        self.computing[worker] = (self.version, self.clocks[worker] - self.slowest())

    def start(self) -> list[int]:
        """Let every worker read version 0; return them (the first weights to send)."""
        for w in sorted(self.live):
            self._read(w)
        return sorted(self.live)

    def arrive(self, worker: int, version_used: int) -> AppliedGradient:
        """Apply ``worker``'s gradient computed on ``version_used``: count it, return its record.

        The worker then waits until :meth:`release` lets it read again.
        """
        if worker not in self.computing:
            state = "waiting for its reply" if worker in self.waiting else "not a live worker"
            raise ValueError(f"worker {worker} sent a gradient but is {state}: protocol error")
        read, lag = self.computing.pop(worker)
        if version_used != read:
            raise ValueError(
                f"worker {worker} says it used version {version_used}, but it was sent {read}"
            )
        if self.bound is not None and lag > self.bound:  # the gate below makes this impossible
            raise AssertionError(
                f"worker {worker} read {lag} clocks ahead, over bound {self.bound}"
            )
        record = AppliedGradient(
            worker=worker,
            step=self.clocks[worker],
            version_used=version_used,
            applied_at=self.version,
            staleness=self.version - version_used,
            clock_lag=lag,
        )
        self.applied.append(record)
        self.version += 1
        self.clocks[worker] += 1
        self.waiting.append(worker)
        return record

    def release(self) -> list[int]:
        """Return the waiting workers the gate lets through now; they read the current version."""
        ready = [w for w in self.waiting if self.may_proceed(w)]
        for w in ready:
            self.waiting.remove(w)
            self._read(w)
        return ready

    def drop(self, worker: int) -> None:
        """Forget ``worker`` (dead or finished): it no longer holds the others back."""
        self.live.discard(worker)
        self.computing.pop(worker, None)
        if worker in self.waiting:
            self.waiting.remove(worker)

    def staleness_by_worker(self) -> dict[int, list[int]]:
        """Return ``{worker: [staleness of each of its applied gradients, in order]}``."""
        out: dict[int, list[int]] = {w: [] for w in self.clocks}
        for a in self.applied:
            out[a.worker].append(a.staleness)
        return out
