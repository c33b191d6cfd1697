"""Lecture 3: The alpha-beta-gamma cost model of collectives, and its calibration (ping-pong, timed ring).

A message of ``n`` bytes takes $\\alpha + n\\beta$: ``alpha`` is the latency (seconds), ``beta``
the time per byte (1 / bandwidth). Reducing ``n`` bytes into a buffer costs $n\\gamma$ more
(``gamma``, seconds per byte of arithmetic). Each algorithm's time follows from how many messages
of which size, and how many bytes reduced, lie on its critical path (Thakur, Rabenseifner &
Gropp 2005; Chan et al. 2007).

Kept whole: the formulas and the fits of their alpha, beta, gamma; lecture 3 imports both here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from course_lib.collectives.common import TAGS
from course_lib.comm.communicator import Communicator

__all__ = [
    "ALGORITHMS",
    "Calibration",
    "LinkModel",
    "REDUCED_BYTES",
    "allreduce_bound",
    "allreduce_times",
    "fit_alpha_beta",
    "fit_collective",
    "gossip_messages",
    "measure_gamma",
    "ping_pong",
    "predict",
    "collective_calibration",
    "time_allreduce",
]


@dataclass(frozen=True)
class LinkModel:
    """Latency ``alpha`` (s), time per byte ``beta`` (s/byte), reduction time per byte ``gamma``."""

    alpha: float
    beta: float
    gamma: float = 0.0

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.beta <= 0 or self.gamma < 0:
            raise ValueError(
                f"need alpha >= 0, beta > 0 and gamma >= 0, got alpha={self.alpha}, "
                f"beta={self.beta}, gamma={self.gamma}"
            )

    @property
    def bandwidth(self) -> float:
        """Return the bandwidth in bytes per second, $1 / \\beta$."""
        return 1.0 / self.beta

    @classmethod
    def from_link(cls, link) -> LinkModel:
        """Return the model of an :class:`~course_lib.comm.EmulatedLink`."""
        return cls(alpha=link.latency, beta=1.0 / link.bandwidth)


def _log2(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def _doubling(n: float, p: int, a: float, b: float) -> float:
    extra = 0 if p & (p - 1) == 0 else 2  # fold the extra ranks in and out
    return (int(math.log2(p)) + extra) * (a + n * b) if p > 1 else 0.0


def _ring_pipelined(n: float, p: int, a: float, b: float, segments: int = 1) -> float:
    # Each ring chunk travels as ``segments`` pieces of s = n / (p * segments) bytes; a piece is
    # forwarded as soon as it lands (Patarasuk & Yuan 2009). The first piece crosses 2(p - 1)
    # steps, the others follow it: 2(p - 1)(a + s b) + (segments - 1) s b. But one rank's link
    # still carries 2(p - 1) n / p bytes after one latency, so the time is at least that (on
    # two ranks: recursive doubling's one step, a + n b). segments=1: the ring.
    if p <= 1:
        return 0.0
    piece = n / (p * segments)
    chain = 2 * (p - 1) * (a + piece * b) + (segments - 1) * piece * b
    return max(chain, a + 2 * (p - 1) * n / p * b)


ALGORITHMS = {
    "p2p": lambda n, p, a, b: a + n * b,
    "ring_allreduce": lambda n, p, a, b: 2 * (p - 1) * (a + n / p * b),
    "ring_allreduce_pipelined": _ring_pipelined,
    "ring_reduce_scatter": lambda n, p, a, b: (p - 1) * (a + n / p * b),
    "ring_allgather": lambda n, p, a, b: (p - 1) * (a + n / p * b),
    "star_allreduce": lambda n, p, a, b: 2 * (p - 1) * (a + n * b),
    "allreduce_naive": lambda n, p, a, b: (p - 1) * (a + n * b),
    "recursive_doubling_allreduce": _doubling,
    "tree_broadcast": lambda n, p, a, b: _log2(p) * (a + n * b),
    "broadcast_naive": lambda n, p, a, b: (p - 1) * (a + n * b),
    "gossip_step": lambda n, p, a, b, s=1: gossip_messages(p, s) * (a + n * b),
}


# Bytes each algorithm reduces (adds) on its critical path, for the gamma term: the ring's owner
# adds N-1 chunks of n/N; the star's root adds N-1 whole buffers; recursive doubling adds one
# whole buffer per exchange (plus the fold-in of an extra rank when N is not a power of two).
REDUCED_BYTES = {
    "ring_allreduce": lambda n, p: (p - 1) * n / p,
    # pipelined, only the last piece's additions are left on the critical path (about one
    # piece per step); counted as the ring's, an upper bound
    "ring_allreduce_pipelined": lambda n, p: (p - 1) * n / p,
    "ring_reduce_scatter": lambda n, p: (p - 1) * n / p,
    "star_allreduce": lambda n, p: (p - 1) * n,
    "allreduce_naive": lambda n, p: (p - 1) * n,
    "recursive_doubling_allreduce": lambda n, p: (
        (int(math.log2(p)) + (0 if p & (p - 1) == 0 else 1)) * n if p > 1 else 0.0
    ),
}


#: The options an algorithm's formula takes (``predict(..., **options)``).
OPTIONS = {"gossip_step": {"s"}, "ring_allreduce_pipelined": {"segments"}}


def gossip_messages(world_size: int, s: int = 1) -> int:
    """Return the messages each rank sends in one ``gossip_step`` at partner distance ``s``.

    Two (to ``i - s`` and ``i + s``), or one when both partners are the same rank: ``s = N / 2``
    (which includes ``N = 2``). None on a single rank.
    """
    if world_size <= 1:
        return 0
    if not 1 <= s < world_size:
        raise ValueError(f"distance s must be in 1..{world_size - 1}, got {s}")
    return 1 if 2 * s == world_size else 2


def predict(
    algorithm: str, nbytes: float, world_size: int, model: LinkModel, **options: int
) -> float:
    """Return the predicted seconds of ``algorithm`` on an ``nbytes`` buffer over ``world_size`` ranks.

    ``options`` go to the algorithm's formula: ``gossip_step`` takes its partner distance ``s``
    (default 1, as in :func:`~course_lib.collectives.gossip_step`), ``ring_allreduce_pipelined``
    its ``segments`` per ring chunk (default 1: the plain ring).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    allowed = OPTIONS.get(algorithm, set())
    if options and not allowed:
        raise ValueError(f"{algorithm} takes no options, got {sorted(options)}")
    if set(options) - allowed:
        raise ValueError(
            f"{algorithm} takes only the option {', '.join(sorted(allowed))}, got {sorted(options)}"
        )
    seconds = ALGORITHMS[algorithm](nbytes, world_size, model.alpha, model.beta, **options)
    if model.gamma and algorithm in REDUCED_BYTES:
        seconds += model.gamma * REDUCED_BYTES[algorithm](nbytes, world_size)
    return float(seconds)


def measure_gamma(nbytes: int = 4 * 2**20, repeats: int = 20) -> float:
    """Return this process's seconds per byte to add one float32 buffer into another (median)."""
    if nbytes < 4:
        raise ValueError(f"nbytes must be at least 4 (one float32), got {nbytes}")
    out, other = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
    np.add(out, other, out=out)  # warm-up: first touch of the pages
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.add(out, other, out=out)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) / out.nbytes


def allreduce_bound(nbytes: float, world_size: int, bandwidth: float) -> float:
    """Return the bandwidth lower bound of any allreduce: $2\\frac{N-1}{N} \\cdot S / B$."""
    return 2 * (world_size - 1) / world_size * nbytes / bandwidth


def fit_alpha_beta(sizes, times) -> LinkModel:
    """Fit $t = \\alpha + n\\beta$ by least squares on relative errors (each point weighted by 1/t).

    Plain least squares would let the largest messages decide everything and could give a
    negative latency; dividing each row by its time fits small and large messages alike.
    """
    n, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    if n.size < 2 or np.unique(n).size < 2:
        raise ValueError("need times for at least two different message sizes")
    design = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return LinkModel(alpha=max(float(alpha), 0.0), beta=max(float(beta), 1e-15))


@dataclass
class Calibration:
    """Ping-pong results: one-way times per message size, the fitted model, and its label."""

    sizes: list[int]
    times: list[float]
    model: LinkModel
    label: str
    samples: dict[int, list[float]] = field(default_factory=dict)


def ping_pong(
    comm: Communicator,
    sizes: list[int] | None = None,
    repeats: int = 5,
    pair: tuple[int, int] = (0, 1),
) -> Calibration:
    """Measure one-way time (half the median round trip) between ``pair`` and fit alpha, beta.

    Every rank calls it; ranks outside ``pair`` only wait. All ranks return the same result.
    """
    sizes = sizes or [2**k for k in range(3, 23, 2)]  # 8 B .. 2 MB
    a, b = pair
    if comm.world_size < 2 or a == b:
        raise ValueError("ping_pong needs two distinct ranks in a communicator of size >= 2")
    tag, samples = TAGS["ping"], {}
    times = np.zeros(len(sizes))
    if comm.rank in pair:
        peer = b if comm.rank == a else a
        for i, size in enumerate(sizes):
            buf = np.zeros(size, dtype=np.uint8)
            rtts = []
            for rep in range(repeats + 1):  # the first round trip warms up the connection
                t0 = time.perf_counter()
                if comm.rank == a:
                    comm.send(buf, peer, tag)
                    comm.recv(buf, peer, tag)
                else:
                    comm.recv(buf, peer, tag)
                    comm.send(buf, peer, tag)
                if rep:
                    rtts.append(time.perf_counter() - t0)
            samples[size] = [r / 2 for r in rtts]
            times[i] = float(np.median(rtts)) / 2
    comm.broadcast(times, src=a)  # ranks outside the pair learn the result too
    model = fit_alpha_beta(sizes, times)
    return Calibration(list(sizes), times.tolist(), model, comm.label, samples)


def time_allreduce(
    comm: Communicator,
    fn: Callable[[Communicator, np.ndarray], Any] | None,
    x: np.ndarray,
    reps: int,
) -> float:
    """Return the median over ``reps`` of the slowest rank's seconds for one allreduce of ``x``.

    ``fn`` is a from-scratch allreduce ``fn(comm, buf)``, or None for the backend's own; every
    rank must call this together. ``x`` is not modified (each run reduces a copy).
    """
    return float(np.median(allreduce_times(comm, fn, x, reps, warmup=1)))


def allreduce_times(
    comm: Communicator,
    fn: Callable[[Communicator, np.ndarray], Any] | None,
    x: np.ndarray,
    reps: int,
    warmup: int = 2,
) -> np.ndarray:
    """Return the slowest rank's seconds for each of ``reps`` allreduces of ``x``, after ``warmup``.

    Same contract as :func:`time_allreduce`; returns every sample, so callers can show the spread.
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    times = []
    for _ in range(reps + warmup):  # warm-up runs set up buffers, connections and caches
        buf = x.copy()
        comm.barrier()
        t0 = time.perf_counter()
        comm.allreduce(buf) if fn is None else fn(comm, buf)
        took = np.array([time.perf_counter() - t0])
        comm.allreduce(took, op="max")  # a collective ends when its slowest rank does
        times.append(float(took[0]))
    return np.array(times[warmup:])


def fit_collective(algorithm: str, sizes, times, world_size: int) -> LinkModel:
    """Fit alpha, beta so that ``predict(algorithm, n, world_size)`` matches ``times`` at ``sizes``.

    Every formula in :data:`ALGORITHMS` is ``a(n, N) alpha + b(n, N) beta``, so the fit is linear
    least squares on relative errors, as in :func:`fit_alpha_beta` (for a ring allreduce,
    ``a = 2 (N - 1)`` messages and ``b = 2 (N - 1) n / N`` bytes on the critical path).
    """
    if algorithm not in ALGORITHMS or algorithm == "gossip_step":
        raise ValueError(f"cannot fit {algorithm!r}; choose one of {sorted(REDUCED_BYTES)}")
    if world_size < 2:
        raise ValueError(f"a collective needs world_size >= 2, got {world_size}")
    n, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    if n.size < 2 or np.unique(n).size < 2:
        raise ValueError("need times for at least two different buffer sizes")
    formula = ALGORITHMS[algorithm]
    design = (
        np.array([[formula(x, world_size, 1.0, 0.0), formula(x, world_size, 0.0, 1.0)] for x in n])
        / t[:, None]
    )
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return LinkModel(alpha=max(float(alpha), 0.0), beta=max(float(beta), 1e-15))


def collective_calibration(
    comm: Communicator,
    algorithm: str = "ring_allreduce",
    sizes: list[int] | None = None,
    reps: int = 3,
    fn: Callable[[Communicator, np.ndarray], Any] | None = None,
) -> Calibration:
    """Fit alpha, beta from the timed collective itself: the link as it sees it; all ranks call.

    Ping-pong times one pair on an otherwise idle network, which is not what a collective sees:
    in a ring every rank sends and receives at once. Where ranks share a few cores the pair gets
    more CPU than each ring rank does (loopback copies are CPU work), and through a token-bucket
    shaper (``tc tbf``, the emulated room) the pauses between ping-pong messages refill the
    bucket, so the first burst of every message passes unshaped. Timing ``algorithm`` (slowest
    rank, median of ``reps``) at ``sizes`` bytes of float32 and fitting its own formula
    (:func:`fit_collective`) measures the rate the collective really gets; reduction arithmetic
    is folded into ``beta`` (``gamma`` is 0). ``fn`` defaults to the kit's function of that name
    in :mod:`course_lib.collectives`. Every rank returns the same result.
    """
    if fn is None:
        from course_lib import collectives

        fn = getattr(collectives, algorithm, None)
        if fn is None or algorithm not in REDUCED_BYTES:
            raise ValueError(
                f"no allreduce named {algorithm!r}; pass fn= or choose one of "
                f"{sorted(REDUCED_BYTES)}"
            )
    sizes = sizes or [2**18, 2**20, 2**22, 2**24]  # 256 KB .. 16 MB
    if comm.world_size < 2:
        raise ValueError("collective_calibration needs a communicator of size >= 2")
    if any(s < 4 * comm.world_size for s in sizes):
        raise ValueError(f"every size must hold at least one float32 per rank, got {sizes}")
    samples = {}
    for size in sizes:
        x = np.ones(size // 4, dtype=np.float32)
        samples[size] = allreduce_times(comm, fn, x, reps, warmup=1).tolist()
    times = np.array([float(np.median(samples[s])) for s in sizes])
    comm.broadcast(times, src=0)  # medians of the same maxima; rank 0's copy makes them identical
    model = fit_collective(algorithm, sizes, times, comm.world_size)
    return Calibration(
        list(sizes), times.tolist(), model, f"{comm.label} ({algorithm} fit)", samples
    )
