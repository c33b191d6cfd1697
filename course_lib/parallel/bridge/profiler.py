"""Lecture 15: One step under ``torch.profiler``, its trace read back by code: compute, communication, overlap.

Practitioners find where a step's time goes with ``torch.profiler``: it records every operator
(``aten::mm``, ``aten::gelu``, ...) and every collective of a process group (on gloo
``gloo:all_reduce``, ``gloo:all_to_all``, ``gloo:send`` / ``gloo:recv``; the ``c10d::`` events
around them are the dispatcher's wrappers, not counted twice) with its start and duration, and
exports a Chrome trace (JSON; open it in ``chrome://tracing`` or Perfetto). Here the trace file
is read back: **compute** is an outermost ``aten::`` operator (``aten::linear``, whose
``aten::addmm`` inside is its own work) that is not a mere view or allocation, **communication** a ``gloo:`` event; their **overlap** is the time
both run at once (on different threads), which is what bucketing and prefetching aim to raise.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TraceSummary", "plot_trace", "profile_step", "read_trace", "summarise"]

#: Operators that only describe or allocate memory: no arithmetic, not counted as compute.
_NOT_COMPUTE = {
    "aten::view", "aten::as_strided", "aten::detach", "aten::reshape", "aten::t",
    "aten::transpose", "aten::expand", "aten::slice", "aten::select", "aten::empty",
    "aten::empty_like", "aten::empty_strided", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::alias", "aten::unsqueeze", "aten::squeeze", "aten::permute",
    "aten::_unsafe_view", "aten::split", "aten::chunk", "aten::narrow", "aten::unbind",
}  # fmt: skip


@dataclass(frozen=True)
class TraceSummary:
    """What one trace holds: events and seconds per kind, and the seconds both kinds overlap."""

    counts: dict[str, int]  # "compute" / "communication" -> events
    seconds: dict[str, float]  # busy seconds (union of each kind's intervals)
    overlap: float  # seconds during which compute and communication both ran
    names: dict[str, int]  # communication events by name (gloo:all_to_all, gloo:send, ...)


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """Return the complete events ("ph": "X") of a Chrome trace file, each with a ``kind``."""
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]
    kept = ("cpu_op", "user_annotation")  # gloo records its collectives as annotations
    ops = sorted((e for e in events if e.get("cat") in kept), key=lambda e: (e["tid"], e["ts"]))
    out, open_until = [], {}  # per thread: when the outermost aten operator now open ends
    for e in ops:
        name, end = e["name"], e["ts"] + e["dur"]
        kind = None
        if name.startswith("gloo:"):
            kind = "communication"
        elif name.startswith("aten::") and e["ts"] >= open_until.get(e["tid"], -1.0):
            open_until[e["tid"]] = end  # what runs inside it is its own work, not counted again
            kind = None if name in _NOT_COMPUTE else "compute"
        if kind:
            out.append(
                {"name": name, "kind": kind, "tid": e["tid"], "ts": e["ts"], "dur": e["dur"]}
            )
    return out


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def summarise(events: list[dict[str, Any]]) -> TraceSummary:
    """Count the events of each kind, their busy time and the time both kinds ran at once."""
    spans = {
        k: _union([(e["ts"], e["ts"] + e["dur"]) for e in events if e["kind"] == k])
        for k in ("compute", "communication")
    }
    both = sum(
        max(0.0, min(b, d) - max(a, c))
        for a, b in spans["compute"]
        for c, d in spans["communication"]
    )
    names: dict[str, int] = {}
    for e in events:
        if e["kind"] == "communication":
            names[e["name"]] = names.get(e["name"], 0) + 1
    return TraceSummary(
        counts={k: sum(e["kind"] == k for e in events) for k in spans},
        seconds={k: sum(b - a for a, b in v) / 1e6 for k, v in spans.items()},
        overlap=both / 1e6,
        names=names,
    )


def profile_step(
    step: Callable[[], object], path: str | Path | None = None
) -> tuple[TraceSummary, list]:
    """Run ``step()`` under ``torch.profiler``, export its Chrome trace, read it back; return (summary, events)."""
    from torch.profiler import ProfilerActivity, profile

    if path is None:
        path = Path(tempfile.mkdtemp(prefix="course_trace_")) / "trace.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    prof.export_chrome_trace(str(path))
    events = read_trace(path)
    return summarise(events), events


def plot_trace(events: list[dict[str, Any]], ax: Any, title: str = "") -> None:
    """Draw a timeline: one row per thread, compute blue and communication orange (ms from the start)."""
    if not events:
        ax.set_title(f"{title} (no events)")
        return
    start = min(e["ts"] for e in events)
    tids = sorted({e["tid"] for e in events})
    colours = {"compute": "tab:blue", "communication": "tab:orange"}
    for row, tid in enumerate(tids):
        for kind, colour in colours.items():
            bars = [
                ((e["ts"] - start) / 1e3, max(e["dur"], 1) / 1e3)
                for e in events
                if e["tid"] == tid and e["kind"] == kind
            ]
            ax.broken_barh(bars, (row - 0.4, 0.8), color=colour, label=kind if row == 0 else None)
    ax.set_yticks(range(len(tids)), [f"thread {i}" for i in range(len(tids))])
    ax.set_xlabel("ms since the step began")
    ax.set_title(title)
    ax.legend(loc="upper right")
