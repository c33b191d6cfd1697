"""Lecture 4: Pictures of data-parallel steps: a stacked bar per rank and a timeline (Gantt chart) per rank."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from course_lib.parallel.data_parallel.accounting import PHASES

__all__ = ["PHASE_COLORS", "plot_breakdown", "plot_timeline"]

PHASE_COLORS = {"compute": "tab:blue", "wait": "tab:gray", "comm": "tab:red", "step": "tab:green",
                "sync": "tab:purple"}  # fmt: skip
_LABELS = {"compute": "forward + backward", "wait": "waiting for the slowest rank",
           "comm": "communication after backward", "step": "optimiser step",
           "sync": "averaging weights after the step"}  # fmt: skip


def plot_breakdown(rows: list[dict[str, Any]], title: str = "") -> Figure:
    """Return a stacked bar per rank of median milliseconds per phase (rows: ``summarize_steps``)."""
    fig = Figure(figsize=(6, 3), dpi=100)
    ax = fig.subplots()
    ranks = [r["rank"] for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        heights = [1e3 * r[f"{phase}_s"] for r in rows]
        if not any(heights):  # a phase this method does not have (no legend entry for it)
            continue
        ax.bar(ranks, heights, bottom=bottom, color=PHASE_COLORS[phase], label=_LABELS[phase])
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel("ms per step (median)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_timeline(
    records: list[dict[str, Any]], steps: tuple[int, int] | None = None, title: str = ""
) -> Figure:
    """Return a Gantt chart: one row per rank with its phases, buckets drawn in a thin row below.

    ``steps`` is a half-open range of step numbers (default: the last two). Bucket bars show
    when each bucket's communication ran; where they lie inside the blue forward + backward bar,
    communication overlapped computation.
    """
    last = max(r["step"] for r in records)
    lo, hi = steps if steps is not None else (max(0, last - 1), last + 1)
    chosen = [r for r in records if lo <= r["step"] < hi]
    if not chosen:
        raise ValueError(f"no steps in range {lo}..{hi - 1}; the run has steps 0..{last}")
    t0 = min(r["compute_at"][0] for r in chosen)
    ranks = sorted({r["rank"] for r in chosen})
    fig = Figure(figsize=(8, 0.8 + 0.7 * len(ranks)), dpi=100)
    ax = fig.subplots()
    seen: set[str] = set()
    for r in chosen:
        y = ranks.index(r["rank"])
        for phase in PHASES:
            start, end = r[f"{phase}_at"]
            if end > start:
                label = _LABELS[phase] if phase not in seen else None
                seen.add(phase)
                ax.barh(
                    y,
                    1e3 * (end - start),
                    left=1e3 * (start - t0),
                    height=0.5,
                    color=PHASE_COLORS[phase],
                    label=label,
                )
        for b in r["buckets"]:
            label = "bucket communication" if "bucket" not in seen else None
            seen.add("bucket")
            ax.barh(
                y + 0.38,
                1e3 * (b["end"] - b["start"]),
                left=1e3 * (b["start"] - t0),
                height=0.18,
                color="tab:orange",
                edgecolor="black",
                linewidth=0.3,
                label=label,
            )
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first step shown began")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or f"steps {lo}..{hi - 1}", fontsize=9)
    fig.tight_layout()
    return fig
