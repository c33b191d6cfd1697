"""Lecture 10: Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2): v model chunks per rank.

The model is cut into $pv$ stages and rank r holds v of them, chunks c = 0 .. v-1, the stages
$cp + r$: a micro-batch goes round the ranks v times. Each chunk does a v-th of the rank's
work, so filling and draining the pipeline takes a v-th as long: the bubble falls from
$(p-1)/m$ to $(p-1)/(vm)$ of the ideal time. The price is messages: a micro-batch crosses
$pv - 1$ boundaries between ranks each way instead of $p - 1$, about v times as many.

The schedule is Megatron-LM's (``forward_backward_pipelining_with_interleaving``): micro-batches
go in groups of p; a rank runs a group's forwards on chunk 0, then the same group on chunk 1,
and so on (backwards in the reverse chunk order), after ``2(p - r - 1) + (v - 1)p`` warm-up
forwards, then one forward and one backward at a time, then the remaining backwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.parallel.pipeline_parallel.schedule import Action, one_f_one_b_schedule

__all__ = ["Interleaved1F1B", "pipeline_messages"]


@dataclass(frozen=True)
class Interleaved1F1B:
    """The interleaved 1F1B schedule with ``num_chunks`` model chunks per rank, as a schedule object.

    Call it like the other schedules, ``(num_stages, num_microbatches, stage) -> actions``; its
    actions name the chunk, ``("F", i, c)``. It travels to the engines by value, with its v.
    """

    num_chunks: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.num_chunks, int) or self.num_chunks < 1:
            raise ValueError(
                f"num_chunks must be a whole number >= 1, got {self.num_chunks!r}: 1 is plain "
                "1F1B, 2 or more interleave (each rank holds that many model chunks)"
            )

    @property
    def name(self) -> str:
        """Return a label for plots and messages."""
        return f"interleaved 1f1b (v={self.num_chunks})"

    def __call__(self, num_stages: int, num_microbatches: int, stage: int) -> list[Action]:
        """Return stage ``stage``'s actions ``(kind, micro-batch, chunk)``."""
        p, m, v = num_stages, num_microbatches, self.num_chunks
        if p < 1 or m < 1 or not 0 <= stage < p:
            raise ValueError(f"need p >= 1, m >= 1 and 0 <= stage < p; got p={p}, m={m}, {stage}")
        if v == 1:  # one chunk per rank: nothing to interleave
            return one_f_one_b_schedule(p, m, stage)
        if m % p:
            # Megatron-LM asserts the same: micro-batches go round the ranks in groups of p.
            raise ValueError(
                f"interleaved 1F1B runs micro-batches in groups of p = {p}: choose m a multiple "
                f"of {p} (got m = {m}), or use plain 1F1B"
            )
        total = m * v  # (micro-batch, chunk) forwards on this rank
        if m == p:  # Megatron-LM: one group only, so every forward comes first
            warmup = total
        else:
            warmup = min(2 * (p - stage - 1) + (v - 1) * p, total)

        def nth(k: int, forward: bool) -> tuple[int, int]:
            group, within = divmod(k, p * v)  # groups of p micro-batches, v chunks each
            chunk = within // p
            return group * p + within % p, chunk if forward else v - 1 - chunk

        actions: list[Action] = [("F", *nth(k, True)) for k in range(warmup)]
        for k in range(total - warmup):  # steady state: a forward, then the oldest backward
            actions += [("F", *nth(warmup + k, True)), ("B", *nth(k, False))]
        actions += [("B", *nth(k, False)) for k in range(total - warmup, total)]
        return actions


def pipeline_messages(num_stages: int, num_microbatches: int, num_chunks: int = 1) -> int:
    """Return the tensors one step sends between ranks: $2m(pv - 1)$ activations and gradients.

    Each of the m micro-batches crosses the $pv - 1$ boundaries between consecutive stages
    once forward (its activation) and once backward (its gradient); the shape headers that
    ``pipeline_step`` sends once per boundary and step are not counted.
    """
    return 2 * num_microbatches * (num_stages * num_chunks - 1)
