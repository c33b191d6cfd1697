"""Lecture 11: The sentences lecture 11 draws from its timings, computed from this run's spreads.

Each function takes the measured spreads (:class:`~course_lib.timing.Spread`) and returns the
sentence they support, through :func:`~course_lib.timing.compare`: a ratio when the ranges are
apart, "within this run's noise" when they overlap, never a hard-coded winner. The tests feed
them swapped numbers and see the sentence change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from course_lib.timing import Spread, compare

__all__ = ["allgather_sentence", "recomputation_sentence"]


def allgather_sentence(
    sync: Mapping[str, Spread | Sequence[float]], messages: Mapping[str, int], *, alpha_s: float
) -> str:
    """Say whether ZeRO-2's allgather of the updated weights takes longer than ZeRO-1's, and why.

    ``sync``: each stage's ``sync`` seconds per step ("ZeRO-1", "ZeRO-2"); ``messages``: the
    messages one rank sends in that allgather (N - 1 per unit: ZeRO-1 one unit, ZeRO-2 one per
    bucket); ``alpha_s``: the link's fixed cost per message. Both send the same bytes, so a gap
    beyond the noise is the messages': each pays the link's alpha and, on engines sharing cores,
    a round of the receiving engine's scheduling.
    """
    one, two = (
        s if isinstance(s, Spread) else Spread.of(s) for s in (sync["ZeRO-1"], sync["ZeRO-2"])
    )
    verdict = compare("ZeRO-1", one, "ZeRO-2", two, quantity="the allgather (sync)")
    m1, m2 = messages["ZeRO-1"], messages["ZeRO-2"]
    per = f"{1e3 * one.median / m1:.2f} and {1e3 * two.median / m2:.2f} ms per message"
    counts = f"the same bytes in {m1} and {m2} messages per rank ({per})"
    if verdict.within_noise:
        return f"{verdict.sentence}: {counts}; no gap to explain in this run"
    if verdict.ratio < 1:
        return f"{verdict.sentence}: {counts}; ZeRO-2's extra messages do not explain this order"
    extra = 1e3 * (two.median - one.median)
    alpha = 1e3 * alpha_s * (m2 - m1)
    return (
        f"{verdict.sentence}: {counts}; the {extra:.1f} ms more are ZeRO-2's {m2 - m1} extra "
        f"messages, each paying a fixed cost ({alpha:.1f} ms of it the link's alpha, the rest "
        "the engines' turns on shared cores)"
    )


def recomputation_sentence(
    plain: Spread | Sequence[float], checkpointed: Spread | Sequence[float], segments: int
) -> str:
    """Say what recomputation with ``segments`` checkpoints cost in time against the plain step."""
    verdict = compare("plain", plain, f"{segments} segments", checkpointed, quantity="the step")
    if verdict.within_noise:
        return f"{verdict.sentence}: recomputation's extra forward is lost in the noise here"
    slower = 1 / verdict.ratio if verdict.ratio < 1 else verdict.ratio
    if verdict.ratio >= 1:
        return (
            f"{verdict.sentence}: recomputation costs {slower - 1:.0%} more "
            "(predicted: about one more forward, a third of forward + backward)"
        )
    return f"{verdict.sentence}: faster with recomputation, against the prediction; time it again"
