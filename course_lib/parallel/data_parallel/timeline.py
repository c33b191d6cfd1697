"""Lecture 4: Pictures of data-parallel steps: a stacked bar per rank and a timeline (Gantt chart) per rank."""

from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_lib.parallel.data_parallel.accounting import PHASES

__all__ = ["PHASE_COLORS", "bucket_overlap", "finish_gantt", "plot_breakdown", "plot_timeline"]

PHASE_COLORS = {"compute": "tab:blue", "wait": "tab:gray", "comm": "tab:red", "step": "tab:green",
                "sync": "tab:purple"}  # fmt: skip
_FORWARD = "#9ecae1"  # the forward part of compute, lighter than its backward
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
    records: list[dict[str, Any]],
    steps: tuple[int, int] | None = None,
    title: str = "",
    ax: Axes | None = None,
) -> Figure:
    """Return a Gantt chart: one row per rank with its phases, each bucket in a thin row below.

    ``steps`` is a half-open range of step numbers (default: the last two). Where the record
    knows when the forward ended (``forward_end``), the compute bar is split into the forward
    (light) and the loss + backward (dark). Bucket bars, one row per bucket index, show when each
    bucket's communication ran; where they lie inside the backward, communication overlapped
    computation. ``ax``: draw into these axes (e.g. one panel of two) instead of a new figure.
    """
    last = max(r["step"] for r in records)
    lo, hi = steps if steps is not None else (max(0, last - 1), last + 1)
    chosen = [r for r in records if lo <= r["step"] < hi]
    if not chosen:
        raise ValueError(f"no steps in range {lo}..{hi - 1}; the run has steps 0..{last}")
    t0 = min(r["compute_at"][0] for r in chosen)
    ranks = sorted({r["rank"] for r in chosen})
    rows = max((len(r["buckets"]) for r in chosen), default=0)
    pitch = 1.0 + 0.16 * max(rows - 1, 0)  # room under each rank for its bucket rows
    if ax is None:
        fig = Figure(figsize=(8, 0.8 + 0.7 * pitch * len(ranks)), dpi=100)
        ax = fig.subplots()
    seen: set[str] = set()

    def bar(y: float, start: float, end: float, key: str, label: str, **style: Any) -> None:
        ax.barh(y, 1e3 * (end - start), left=1e3 * (start - t0),
                label=label if key not in seen else None, **style)  # fmt: skip
        seen.add(key)

    for r in chosen:
        y = pitch * ranks.index(r["rank"])
        for phase in PHASES:
            start, end = r[f"{phase}_at"]
            if end <= start:
                continue
            split = r.get("forward_end", 0.0)
            if phase == "compute" and start < split < end:
                bar(y, start, split, "forward", "forward", height=0.5, color=_FORWARD)
                bar(y, split, end, "backward", "loss + backward", height=0.5,
                    color=PHASE_COLORS["compute"])  # fmt: skip
            else:
                bar(y, start, end, phase, _LABELS[phase], height=0.5, color=PHASE_COLORS[phase])
        for k, b in enumerate(sorted(r["buckets"], key=lambda b: b["index"])):
            row = y + 0.36 + 0.16 * k
            bar(row, b["start"], b["end"], "bucket", "bucket communication (one row a bucket)",
                height=0.13, color="tab:orange", edgecolor="black", linewidth=0.3)  # fmt: skip
            ax.text(1e3 * (b["start"] - t0), row, f"b{b['index']} ", ha="right", va="center",
                    fontsize=6)  # fmt: skip
    ticks = [pitch * k for k in range(len(ranks))]
    return finish_gantt(ax, ticks, [f"rank {r}" for r in ranks],
                        "ms since the first step shown began", title or f"steps {lo}..{hi - 1}")  # fmt: skip


def finish_gantt(
    ax: Axes, ticks: list[float], labels: list[str], xlabel: str, title: str
) -> Figure:
    """Label a per-rank Gantt chart (ranks top-down, legend outside) and return its figure."""
    ax.set_yticks(ticks, labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title, fontsize=9)
    fig = ax.figure
    if isinstance(fig, Figure):
        fig.tight_layout()
    return fig


def bucket_overlap(records: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """Return, for ``step``, one row per rank and bucket: when its communication ran, in ms
    from the start of that rank's backward (``forward_end``), beside the backward's length.

    ``backward_ms`` ends when the loop got the gradients back (for DDP: after its last bucket).
    A bucket with ``start_ms`` below ``backward_ms`` started while backward was still running.
    Rows without buckets or without ``forward_end`` are left out.
    """
    rows = []
    for r in sorted((r for r in records if r["step"] == step), key=lambda r: r["rank"]):
        begin = r.get("forward_end", 0.0)
        if not begin:
            continue
        backward_ms = 1e3 * (r["compute_at"][1] - begin)
        for b in sorted(r["buckets"], key=lambda b: b["index"]):
            rows.append({
                "rank": r["rank"], "bucket": b["index"], "kB": round(b["nbytes"] / 1e3),
                "start_ms": round(1e3 * (b["start"] - begin), 1),
                "end_ms": round(1e3 * (b["end"] - begin), 1),
                "backward_ms": round(backward_ms, 1),
            })  # fmt: skip
    return rows
