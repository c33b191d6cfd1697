"""Lecture 10: Pipeline schedules (naive, GPipe, 1F1B) and a pure simulation of them: no engines, no torch.

A schedule is, for each stage, the ordered list of its actions: ``("F", i)`` runs the forward
pass of micro-batch ``i``, ``("B", i)`` its backward pass. A schedule whose ranks hold several
model chunks (interleaved 1F1B, :mod:`.interleaved`) names the chunk too, ``("F", i, c)``, and
says how many in its ``num_chunks`` attribute; a two-part action is chunk 0. The same lists
drive the real pipeline (``course_lib.parallel.pipeline_parallel.pipeline``) and
:func:`simulate`, which turns per-stage costs into a timeline, so a slider can explore p, m and
uneven stages in milliseconds.

- **naive**: one micro-batch at a time through all stages and back (F0 B0 F1 B1 ...): exactly
  one stage is ever busy, the bubble is $(p-1)/p$ (source 001: layer parallelism idles).
- **GPipe** (Huang et al. 2019): all m forwards, then all m backwards, gradients accumulated;
  bubble $(p-1)/(m+p-1)$ for balanced stages, but stage 0 stores all m micro-batches.
- **1F1B** (PipeDream-Flush, Narayanan et al. 2021): stage s runs ``p - s - 1`` warm-up
  forwards, then alternates one forward and one backward, then drains the backwards. Same
  bubble as GPipe, but stage s stores at most ``p - s`` micro-batches, not m.

Kept whole: the schedules and their simulation share one action format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "SCHEDULES",
    "Interval",
    "Timeline",
    "action_chunk",
    "bubble_formula",
    "bubble_ratio_formula",
    "gpipe_schedule",
    "in_flight",
    "in_flight_formula",
    "naive_schedule",
    "num_chunks",
    "one_f_one_b_schedule",
    "plot_schedule",
    "schedule",
    "simulate",
]

Action = tuple[str, int] | tuple[str, int, int]
ScheduleFn = Callable[[int, int, int], list[Action]]


def action_chunk(action: Action) -> int:
    """Return the model chunk an action runs on: its third part, or 0 for ``("F", i)``."""
    return action[2] if len(action) > 2 else 0


def num_chunks(name: str | ScheduleFn) -> int:
    """Return how many model chunks each rank holds under schedule ``name`` (1 unless it says)."""
    return int(getattr(name, "num_chunks", 1))


def naive_schedule(num_stages: int, num_microbatches: int, stage: int) -> list[Action]:
    """Return F0 B0 F1 B1 ...: no two stages ever work at once (why nobody pipelines this way)."""
    return [a for i in range(num_microbatches) for a in (("F", i), ("B", i))]


def gpipe_schedule(num_stages: int, num_microbatches: int, stage: int) -> list[Action]:
    """Return all forwards then all backwards (GPipe): every stage stores m micro-batches."""
    m = num_microbatches
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b_schedule(num_stages: int, num_microbatches: int, stage: int) -> list[Action]:
    """Return warm-up forwards, then one-forward-one-backward, then the remaining backwards."""
    m = num_microbatches
    warmup = min(num_stages - stage - 1, m)
    actions = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):  # steady state: a forward, then the oldest backward
        actions += [("F", warmup + i), ("B", i)]
    actions += [("B", i) for i in range(m - warmup, m)]
    return actions


SCHEDULES = {"naive": naive_schedule, "gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}


def schedule(
    name: str | ScheduleFn, num_stages: int, num_microbatches: int, stage: int
) -> list[Action]:
    """Return stage ``stage``'s actions under ``name``: ``naive``, ``gpipe``, ``1f1b`` or an object."""
    if not callable(name) and name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError(
            f"need at least 1 stage and 1 micro-batch, got p={num_stages}, m={num_microbatches}"
        )
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} is out of range 0..{num_stages - 1}")
    fn = name if callable(name) else SCHEDULES[name]
    return fn(num_stages, num_microbatches, stage)


def in_flight(name: str | ScheduleFn, num_stages: int, num_microbatches: int) -> list[int]:
    """Return, per stage, the most micro-batches whose activations it holds at once under ``name``.

    Read from the action lists alone, without timing: a forward stores its micro-batch's
    activations until that micro-batch's backward frees them (lecture 11: what 1F1B saves).
    With model chunks, a (micro-batch, chunk) pair counts one: a chunk's share of the stage.
    """
    peaks = []
    for s in range(num_stages):
        held = peak = 0
        for action in schedule(name, num_stages, num_microbatches, s):
            held += 1 if action[0] == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def in_flight_formula(name: str, num_stages: int, num_microbatches: int, stage: int) -> int:
    """Return stage ``stage``'s micro-batches in flight at the peak: GPipe m, 1F1B min(p - s, m)."""
    formulas = {
        "naive": 1,
        "gpipe": num_microbatches,
        "1f1b": min(num_stages - stage, num_microbatches),
    }
    if name not in formulas:
        raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(formulas)}")
    return formulas[name]


def bubble_formula(num_stages: int, num_microbatches: int, num_chunks: int = 1) -> float:
    """Return the idle share of a step for balanced stages, $(p-1)/(vm+p-1)$ (GPipe, 1F1B: v = 1).

    The idle stage-time over all stage-time, what :attr:`Timeline.bubble_fraction` measures
    (Huang et al. 2019); with v chunks per rank the fill and drain shrink v-fold (Narayanan et
    al. 2021, section 2.2.2).
    """
    return (num_stages - 1) / (num_chunks * num_microbatches + num_stages - 1)


def bubble_ratio_formula(num_stages: int, num_microbatches: int, num_chunks: int = 1) -> float:
    """Return Narayanan et al.'s bubble fraction $t_{pb}/t_{id} = (p-1)/(vm)$: idle over compute.

    The same idle time as :func:`bubble_formula`, over the ideal (busy) time instead of the
    whole step (Narayanan et al. 2021, section 2.2); :attr:`Timeline.bubble_ratio` measures it.
    """
    return (num_stages - 1) / (num_chunks * num_microbatches)


@dataclass(frozen=True)
class Interval:
    """One piece of a stage's timeline: ``kind`` is F, B, send, recv (or idle); seconds."""

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    chunk: int = 0  # the model chunk it ran on (interleaved schedules)


@dataclass
class Timeline:
    """Intervals of every stage, with the bubble and the peak of stored activations per stage."""

    intervals: list[Interval]
    num_stages: int
    peak_activations: list[int] = field(default_factory=list)
    #: per stage, the most activation bytes autograd held at once (measured by ``pipeline_step``)
    peak_activation_bytes: list[int] = field(default_factory=list)

    @classmethod
    def merge(cls, timelines: Sequence[Timeline]) -> Timeline:
        """Return one timeline of every stage from each rank's own (``pipeline_step`` results)."""
        intervals = [iv for t in timelines for iv in t.intervals]
        return cls(
            intervals,
            len(timelines),
            [t.peak_activations[0] for t in timelines],
            [b for t in timelines for b in t.peak_activation_bytes[:1]],
        )

    @property
    def makespan(self) -> float:
        """Return the time from the first start to the last end."""
        return max(iv.end for iv in self.intervals) - min(iv.start for iv in self.intervals)

    def busy(self, stage: int) -> float:
        """Return the seconds ``stage`` spent computing (forward and backward)."""
        return sum(
            iv.end - iv.start for iv in self.intervals if iv.stage == stage and iv.kind in "FB"
        )

    @property
    def bubble_fraction(self) -> float:
        """Return $1 - \\sum_s busy_s / (p \\cdot makespan)$: the share of stage-time spent idle."""
        total = self.num_stages * self.makespan  # (total - busy) / total: exact for Fractions
        return (total - sum(self.busy(s) for s in range(self.num_stages))) / total

    @property
    def bubble_ratio(self) -> float:
        """Return idle over busy stage-time, Narayanan et al.'s $t_{pb}/t_{id}$ (2021, section 2.2)."""
        busy = sum(self.busy(s) for s in range(self.num_stages))
        return (self.num_stages * self.makespan - busy) / busy


def simulate(
    name: str | ScheduleFn,
    forward_costs: Sequence[float],
    num_microbatches: int,
    backward_costs: Sequence[float] | None = None,
    comm_cost: float = 0,
) -> Timeline:
    """Run schedule ``name`` on paper: stage s's forward of one micro-batch takes forward_costs[s].

    ``name`` is one of :data:`SCHEDULES`, a function ``(p, m, stage) -> actions`` of your own,
    or a schedule object with ``num_chunks`` (``Interleaved1F1B``).

    ``backward_costs`` defaults to twice the forward (a backward computes two gradients);
    ``comm_cost`` is the time one activation (or gradient) takes between neighbouring stages.
    Each stage runs its actions in order, each as soon as its input has arrived. With v model
    chunks per rank, chunk c of stage s is virtual stage $cp + s$ of a $pv$-stage pipeline (the
    data goes round the ranks v times) and each chunk costs a v-th of its stage's costs.
    """
    p, m, v = len(forward_costs), num_microbatches, num_chunks(name)
    back = list(backward_costs) if backward_costs is not None else [2 * c for c in forward_costs]
    if len(back) != p:
        raise ValueError(f"got {p} forward costs but {len(back)} backward costs: one per stage")
    plans = [schedule(name, p, m, s) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, virtual stage, micro-batch) -> end
    free, nxt = [0] * p, [0] * p  # ints, so Fraction costs stay exact
    stored, peaks = [0] * p, [0] * p
    intervals: list[Interval] = []
    while any(nxt[s] < len(plans[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while nxt[s] < len(plans[s]):
                action = plans[s][nxt[s]]
                kind, i, c = action[0], action[1], action_chunk(action)
                k = c * p + s  # the virtual stage: v = 1 gives k = s
                if kind == "F":  # needs the activation from the stage before
                    dep = ("F", k - 1, i) if k > 0 else None
                else:  # needs the gradient from the stage after (the last stage has the loss)
                    dep = ("B", k + 1, i) if k < p * v - 1 else None
                    if ("F", k, i) not in done:  # and its own forward's activations
                        break
                if dep is not None and dep not in done:
                    break  # wait for the neighbour
                arrives = 0 if dep is None else done[dep] + comm_cost
                start = max(free[s], arrives)
                cost = forward_costs[s] if kind == "F" else back[s]
                cost = cost if v == 1 else cost / v
                free[s] = done[(kind, k, i)] = start + cost
                intervals.append(Interval(s, kind, i, start, start + cost, c))
                stored[s] += 1 if kind == "F" else -1
                peaks[s] = max(peaks[s], stored[s])
                nxt[s] += 1
                progressed = True
        if not progressed:  # cannot happen for the schedules above; guards a new one
            waiting = {s: plans[s][nxt[s]] for s in range(p) if nxt[s] < len(plans[s])}
            raise RuntimeError(f"the schedule deadlocks: stages wait for each other at {waiting}")
    return Timeline(intervals, p, peaks)


COLOURS = {"F": "tab:blue", "B": "tab:orange", "send": "tab:green", "recv": "lightgrey"}
HATCHES = ("", "//", "xx", "..", "\\\\", "++")  # chunk 0 plain, chunk 1 striped, ...


def plot_schedule(timeline: Timeline, ax=None, title: str = ""):
    """Draw a Gantt chart: one row per stage, F blue, B orange, send green, recv (waiting) grey.

    With model chunks (interleaved schedules), chunk 0 is drawn plain, chunk 1 striped, and so on.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * timeline.num_stages))
    t0 = min(iv.start for iv in timeline.intervals)
    for iv in timeline.intervals:
        ax.barh(
            iv.stage,
            iv.end - iv.start,
            left=iv.start - t0,
            color=COLOURS.get(iv.kind, "k"),
            edgecolor="white" if iv.kind in "FB" else None,
            hatch=HATCHES[iv.chunk % len(HATCHES)] if iv.kind in "FB" else None,
            height=0.8,
        )
        if (
            iv.kind in "FB"
            and timeline.makespan > 0
            and (iv.end - iv.start) / timeline.makespan > 0.025
        ):
            ax.text(
                (iv.start + iv.end) / 2 - t0,
                iv.stage,
                str(iv.microbatch),
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    ax.set_yticks(range(timeline.num_stages))
    ax.set_yticklabels([f"stage {s}" for s in range(timeline.num_stages)])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    kinds = sorted({iv.kind for iv in timeline.intervals}, key=list(COLOURS).index)
    handles = [Patch(color=COLOURS[k], label=k) for k in kinds]
    chunks = sorted({iv.chunk for iv in timeline.intervals})
    if len(chunks) > 1:  # one striped patch per chunk
        handles += [
            Patch(facecolor="grey", edgecolor="white", hatch=HATCHES[c % len(HATCHES)],
                  label=f"chunk {c}")
            for c in chunks
        ]  # fmt: skip
    ax.legend(
        handles=handles,
        loc="upper right",
        fontsize=7,
        ncol=len(handles),
    )
    ax.set_title(title or f"bubble {timeline.bubble_fraction:.1%}")
    return ax
