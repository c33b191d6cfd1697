"""Lectures 5, 7, 9 and 10: the questions at the end of each lecture; numeric answers computed by the lecture's own code."""

from __future__ import annotations

import numpy as np

from course_lib.compression.int8 import int8_encode
from course_lib.parallel.asynchronous.staleness import StalenessLedger
from course_lib.parallel.model_parallel.hybrid import data_parallel_bytes, dense_params
from course_lib.parallel.pipeline_parallel.interleaved import pipeline_messages
from course_lib.parallel.pipeline_parallel.schedule import bubble_formula, in_flight_formula
from course_lib.teaching.questions import Numeric, Question, choice

__all__ = ["LATER"]


def _staleness(order: list[int], workers: int) -> list[int]:
    """Replay ``order`` on the asynchronous server's ledger (lecture 5's bookkeeping)."""
    ledger = StalenessLedger(list(range(1, workers + 1)), bound=None)
    ledger.start()
    for w in order:
        ledger.arrive(w, ledger.computing[w][0])
        ledger.release()
    return [a.staleness for a in ledger.applied]


def _lecture5() -> list[Question]:
    stale = _staleness([1, 2, 1, 2], 2)
    return [
        Numeric("5.q1", "Local-SGD(4) for 100 local steps: how many averaging rounds?",
                100 / 4, "one average every H = 4 steps", rel_tol=1e-9),
        Numeric("5.q2", "An asynchronous server, 2 workers, gradients arriving from workers "
                "1, 2, 1, 2: the staleness of the last one?", float(stale[-1]),
                f"the server records {stale}: updates applied since that worker last read",
                rel_tol=1e-9),
        choice("5.q3", "Stale-synchronous training with bound s = 0 is ...",
               ("bulk-synchronous training", "fully asynchronous", "Local-SGD(2)"), 0,
               "no worker may run ahead of the slowest"),
        choice("5.q4", "One worker is twice as slow. Bulk-synchronous steps then take ...",
               ("the slowest worker's time", "the mean worker's time", "the fastest's"), 0,
               "every step waits at the barrier for the straggler"),
        choice("5.q5", "What does an asynchronous server trade for never waiting?",
               ("gradients computed on stale weights", "more bytes per step",
                "a smaller batch"), 0, "staleness slows convergence per sample"),
    ]  # fmt: skip


def _lecture7() -> list[Question]:
    q, _ = int8_encode(np.array([0.5, 1.0], dtype=np.float32))
    return [
        Numeric("7.q1", "int8 with one float32 max-abs scale on 1000 float32 values: the "
                "compression ratio?", 4000 / (1000 + 4), "4n bytes over n + 4"),
        Numeric("7.q2", "Top-k with k = n / 100, each value sent as float32 with an int32 "
                "index: the compression ratio?", 4 * 100 / 8,
                "4n bytes over 8k bytes", rel_tol=1e-9),
        Numeric("7.q3", "int8 max-abs with the truncating cast: g = 0.5 in a gradient whose "
                "max |g| is 1.0 becomes which integer?", float(q[0]), "int(g / m × 127)",
                rel_tol=1e-9),
        choice("7.q4", "Error feedback ...", ("adds what compression dropped to the next "
               "gradient", "sends the error as a second message", "averages the errors over "
               "ranks"), 0, "the residual is kept and re-sent later"),
        choice("7.q5", "Why does a lossless codec shrink int8 gradients so well?",
               ("most values round to zero", "int8 is already compressed",
                "the scale is repeated"), 0, "a peaked histogram has low entropy"),
    ]  # fmt: skip


def _lecture9() -> list[Question]:
    return [
        Numeric("9.q1", "A column-parallel linear layer 64 -> 128 with bias on 4 ranks: "
                "parameters per rank?", float(dense_params([64, 128 // 4])),
                "in × out / N weights and out / N biases", rel_tol=1e-9),
        Numeric("9.q2", "Data parallelism on 4 ranks for a model of 100 000 parameters "
                "(float32): kB each rank sends per step in a ring allreduce?",
                data_parallel_bytes(100_000, 4) / 1e3, "2 (N - 1) / N × 4 P bytes",
                unit="kB"),
        Numeric("9.q3", "Megatron's MLP pair (column- then row-parallel): allreduces per "
                "forward pass?", 1.0, "the column layer needs none; the row layer sums once",
                rel_tol=1e-9),
        choice("9.q4", "A row-parallel layer's output on each rank is ...",
               ("a partial sum, completed by an allreduce", "a slice of the columns",
                "the full output"), 0, "each rank multiplies its rows of W by its slice of X"),
        choice("9.q5", "Tensor parallelism fits best where ...",
               ("links are fast (inside a node)", "links are slow (across PCs)",
                "the batch is large"), 0, "it communicates every layer, forward and backward"),
    ]  # fmt: skip


def _lecture10() -> list[Question]:
    return [
        Numeric("10.q1", "GPipe with p = 4 stages and m = 4 micro-batches: the bubble's share "
                "of the step?", bubble_formula(4, 4), "(p - 1) / (m + p - 1)"),
        Numeric("10.q2", "The same with m = 16 micro-batches?", bubble_formula(4, 16),
                "(p - 1) / (m + p - 1)"),
        Numeric("10.q3", "Interleaved 1F1B, p = 4, m = 8, v = 2 chunks per rank: the bubble's "
                "share?", bubble_formula(4, 8, 2), "(p - 1) / (v m + p - 1)"),
        Numeric("10.q4", "1F1B with p = 4, m = 8: micro-batches whose activations stage 0 "
                "holds at its peak?", float(in_flight_formula("1f1b", 4, 8, 0)),
                "min(p - s, m); GPipe holds all m", rel_tol=1e-9),
        Numeric("10.q5", "p = 4, m = 8, v = 2: point-to-point messages per step?",
                float(pipeline_messages(4, 8, 2)), "2 m (p v - 1)", rel_tol=1e-9),
        choice("10.q6", "Why 1F1B rather than GPipe at the same bubble?",
               ("it stores fewer activations", "it has no bubble", "it sends fewer bytes"),
               0, "a backward frees a micro-batch as soon as it can"),
    ]  # fmt: skip


LATER: dict[int, list[Question]] = {
    5: _lecture5(),
    7: _lecture7(),
    9: _lecture9(),
    10: _lecture10(),
}
