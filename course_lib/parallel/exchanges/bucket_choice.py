"""Lecture 4: Which allreduce each bucket uses: measure the path once, then let the cost model pick.

A bucket's allreduce pays a latency per message step and a time per byte. The ring takes
$2(N-1)$ steps of $S/N$ bytes; recursive doubling takes $\\log_2 N$ steps of the whole $S$
(Thakur, Rabenseifner & Gropp 2005). On two ranks doubling sends the same bytes in half the
steps, so it always wins; on more ranks it wins below a crossover size $S^*$ set by $\\alpha/\\beta$:
$S^* = 8\\alpha/\\beta$ on four ranks. MPI libraries switch algorithms at fixed sizes; here the
exchange measures $\\alpha$ and $\\beta$ of the path its messages really take (through the emulated
link if there is one, and through this machine's own scheduling delays, which on a busy PC are
far above the wire's latency) and asks :func:`~course_lib.cost_model.alpha_beta.predict` for each bucket.
Every rank must choose the same algorithm, so the measurements are agreed by a max-allreduce.
A ring whose chunks travel in segments (the exchange's ``segment_bytes``) overlaps its steps'
latencies; it is priced as it runs (``ring_allreduce_pipelined``), which moves the crossover down.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from course_lib.collectives.ring import ring_allreduce
from course_lib.collectives.ring_pipelined import segment_count
from course_lib.comm.communicator import CommMismatchError, Communicator
from course_lib.cost_model.alpha_beta import LinkModel, predict

__all__ = ["ALGORITHMS", "agree_on_layout", "choose_algorithms", "measure_path"]

#: What ``BucketedAllreduce(algorithm=...)`` accepts: the cost model's name of each choice.
ALGORITHMS = {
    "ring": "ring_allreduce",
    "doubling": "recursive_doubling_allreduce",
    "builtin": "builtin",
}
_PROBE_TAG = 8117  # clear of the collectives' 8100-8112 and the pipelined ring's 8119 and up
_SMALL, _LARGE = 8, 1 << 18  # bytes: a message that is all latency, and one that is mostly bytes


def agree_on_layout(comm: Communicator, sizes: list[int]) -> None:
    """Raise ``CommMismatchError`` unless every rank has the same bucket sizes (in order).

    The buckets' receives are posted before the sizes are known ("eager"), which is safe only
    once the ranks agree; a max-allreduce of ``(count, total, crc)`` and of their negations
    finds any difference.
    """
    mine = np.array([len(sizes), sum(sizes), _checksum(sizes)], dtype=np.int64)
    both = np.concatenate([mine, -mine])
    ring_allreduce(comm, both, op="max")
    if not (np.array_equal(both[:3], mine) and np.array_equal(-both[3:], mine)):
        raise CommMismatchError(
            f"rank {comm.rank} has {len(sizes)} buckets of {sum(sizes)} bytes, another rank "
            "has a different layout: every replica must have the same trainable parameters "
            "and the same bucket_bytes"
        )


def measure_path(comm: Communicator, repeats: int = 5) -> LinkModel:
    """Return alpha and beta of one ring step here (sendrecv with both neighbours), agreed by max.

    Times ``repeats`` exchanges of 8 bytes (alpha) and 3 of 256 KiB (beta from the difference),
    so the model holds what the buckets will see: the emulated link, the real one, and the
    delays of waking the communication thread. Every rank calls it.
    """
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size

    def median_step(nbytes: int, count: int) -> float:
        out, into = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        times = []
        for _ in range(count):
            start = time.perf_counter()
            comm.sendrecv(out, right, into, left, tag=_PROBE_TAG)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    alpha = median_step(_SMALL, repeats)
    large = median_step(_LARGE, max(1, repeats // 2 + 1))
    beta = max((large - alpha) / (_LARGE - _SMALL), 1e-12)
    agreed = np.array([alpha, beta])
    ring_allreduce(comm, agreed, op="max")
    return LinkModel(alpha=float(agreed[0]), beta=float(agreed[1]))


def choose_algorithms(
    sizes: list[int],
    world_size: int,
    algorithm: str,
    model: LinkModel | None = None,
    segment_bytes: int | None = None,
) -> list[str]:
    """Return the algorithm (a key of :data:`ALGORITHMS`) for each bucket of ``sizes`` bytes.

    ``algorithm="auto"`` picks, per bucket, the faster of ring and doubling under ``model``;
    any other name is used for every bucket. With ``segment_bytes`` the ring is priced as it
    runs, its chunks pipelined in segments of that size (latency per step mostly hidden).
    """
    if algorithm != "auto":
        return [algorithm] * len(sizes)
    if world_size <= 1:  # nothing to reduce: the thread still calls the (trivial) ring
        return ["ring"] * len(sizes)
    if model is None:
        raise ValueError("algorithm='auto' needs a model of the path: call measure_path first")
    # doubling first: a tie (two ranks, the ring in segments) goes to the fewer messages
    return [
        min(("doubling", "ring"), key=lambda a: _predicted(a, s, world_size, model, segment_bytes))
        for s in sizes
    ]


def _predicted(
    algorithm: str, nbytes: int, world_size: int, model: LinkModel, segment_bytes: int | None
) -> float:
    """Return the cost model's seconds for one bucket's allreduce by ``algorithm``."""
    if algorithm == "ring" and segment_bytes:
        segments = segment_count(nbytes // 4, 4, world_size, segment_bytes)
        return predict("ring_allreduce_pipelined", nbytes, world_size, model, segments=segments)
    return predict(ALGORITHMS[algorithm], nbytes, world_size, model)


def _checksum(sizes: list[int]) -> int:
    value = 0
    for s in sizes:
        value = (value * 1_000_003 + s) % (1 << 61)
    return value
