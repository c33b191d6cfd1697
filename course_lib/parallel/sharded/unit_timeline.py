"""Lecture 11: One stage-3 step as a picture: each rank's compute and its units' collectives on the communication thread.

Stage 3 (:mod:`.fsdp_unit`) notes in each step's record every collective it queued (``events``:
kind, unit, ``issued_at``, ``start_at`` and ``end_at`` on the communication thread). Drawn beside
the training thread's phases, the picture shows which transfers overlapped compute and which the
training thread waited for. :func:`collective_spread` measures the other cost a collective has on
several ranks: it starts only once the last rank has asked for it.
"""

from __future__ import annotations

import statistics
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_lib.parallel.data_parallel.timeline import PHASE_COLORS, finish_gantt

__all__ = ["KIND_COLORS", "collective_spread", "plot_unit_timeline"]

#: One colour per kind of collective (the allgathers by the pass they serve).
KIND_COLORS = {
    "allgather forward": "#9e9ac8",
    "allgather backward": "#6a51a3",
    "reduce_scatter": "tab:orange",
}
_TRAINING = {"forward": ("#9ecae1", "forward"), "backward": (PHASE_COLORS["compute"], "loss + backward"),
             "comm": (PHASE_COLORS["wait"], "waiting for the queue"),
             "step": (PHASE_COLORS["step"], "optimiser step")}  # fmt: skip


def _kind(event: dict[str, Any]) -> str:
    return f"allgather {event['for']}" if event["kind"] == "allgather" else event["kind"]


def _jobs(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in record.get("events", []) if "end_at" in e]


def plot_unit_timeline(
    records: list[dict[str, Any]], step: int | None = None, title: str = "", ax: Axes | None = None
) -> Figure:
    """Return a Gantt chart of stage-3 ``step`` (default: the last): per rank, the training
    thread's phases above and the communication thread's collectives below, each labelled
    ``u<unit>`` (f: for forward, b: for backward, rs: reduce-scatter)."""
    step = max(r["step"] for r in records) if step is None else step
    chosen = sorted((r for r in records if r["step"] == step), key=lambda r: r["rank"])
    if not chosen or not any(_jobs(r) for r in chosen):
        raise ValueError(f"step {step} has no stage-3 collectives: pass a Zero3 run's records")
    t0 = min(r["compute_at"][0] for r in chosen)
    if ax is None:
        fig = Figure(figsize=(8, 0.6 + 0.9 * len(chosen)), dpi=100)
        ax = fig.subplots()
    seen: set[str] = set()

    def bar(y: float, start: float, end: float, color: str, label: str) -> None:
        ax.barh(y, 1e3 * (end - start), left=1e3 * (start - t0), height=0.32, color=color,
                edgecolor="black", linewidth=0.3, label=None if label in seen else label)  # fmt: skip
        seen.add(label)

    for k, r in enumerate(chosen):
        start, end = r["compute_at"]
        split = r.get("forward_end", 0.0) or start
        spans = {"forward": (start, split), "backward": (split, end),
                 "comm": r["comm_at"], "step": r["step_at"]}  # fmt: skip
        for phase, (a, b) in spans.items():
            if b > a:
                bar(k, a, b, *_TRAINING[phase])
        for e in _jobs(r):
            bar(k + 0.36, e["start_at"], e["end_at"], KIND_COLORS[_kind(e)], _kind(e))
            tag = "rs" if e["kind"] == "reduce_scatter" else e["for"][0]
            ax.text(1e3 * (e["start_at"] - t0), k + 0.36, f" u{e['unit']}{tag}", va="center",
                    fontsize=6)  # fmt: skip
    return finish_gantt(
        ax,
        [k + 0.18 for k in range(len(chosen))],
        [f"rank {r['rank']}" for r in chosen],
        "ms since the first rank began the step (upper bar: training; lower: its queue)",
        title or f"step {step}",
    )


def collective_spread(records: list[dict[str, Any]], first_step: int = 1) -> list[dict[str, Any]]:
    """Return one row per collective of a step (its n-th in the queue): the median over steps
    from ``first_step`` of how far apart the ranks started it and of its time from the last
    rank's start to the first rank's end (the pass itself), in ms."""
    per_step: dict[int, list[list[dict[str, Any]]]] = {}
    for r in records:
        if r["step"] >= first_step:
            per_step.setdefault(r["step"], []).append(_jobs(r))
    rows = []
    for n in range(min((len(j) for steps in per_step.values() for j in steps), default=0)):
        spread, run = [], []
        for steps in per_step.values():
            starts = [jobs[n]["start_at"] for jobs in steps]
            spread.append(max(starts) - min(starts))
            run.append(min(jobs[n]["end_at"] for jobs in steps) - max(starts))
        e = next(iter(per_step.values()))[0][n]
        rows.append({"collective": f"{_kind(e)} u{e['unit']}",
                     "start_spread_ms": round(1e3 * statistics.median(spread), 1),
                     "pass_ms": round(1e3 * statistics.median(run), 1)})  # fmt: skip
    return rows
