"""Lecture 5: What an asynchronous run returns: every applied gradient, per-worker timelines, the accuracy curve.

:func:`~course_lib.parallel.asynchronous.train.train_asynchronous` builds an :class:`AsyncResult` from
the server's log (one entry per applied gradient, with its staleness) and the workers' own logs
(one record per gradient pushed, with the wall-clock spans of its phases).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure

from course_lib.parallel.asynchronous.staleness import staleness_limit
from course_lib.parallel.data_parallel.timeline import PHASE_COLORS

__all__ = ["WORKER_PHASES", "AsyncResult"]

WORKER_PHASES = {"wait": "waiting for the server's reply", "pull": "receiving weights",
                 "compute": "forward + backward", "push": "sending the gradient"}  # fmt: skip
_COLORS = {**PHASE_COLORS, "pull": "tab:orange", "push": "tab:red", "apply": "tab:green"}
_COLORS = {**PHASE_COLORS, "pull": "tab:orange", "push": "tab:red", "apply": "tab:green"}


@dataclass
class AsyncResult:
    """What an asynchronous run returns: accuracy curve, every applied gradient, timelines, losses."""

    scheme: str
    staleness_bound: int | None
    world_size: int
    label: str
    emulated: bool
    history: list[dict[str, float]]  # updates, seconds, test_loss, test_accuracy
    applied: list[dict[str, Any]]  # one per applied gradient (AppliedGradient's fields + times)
    records: list[dict[str, Any]]  # one per gradient a worker pushed, with its phases
    steps: dict[int, int]  # gradients each worker pushed (its last one may not be applied)
    dead: list[int]  # ranks of the workers lost during the run
    dead_reports: dict[int, str]
    weights: dict[str, Any]
    stragglers: dict[int, Any] = field(default_factory=dict)
    engines: list[dict[str, Any]] = field(default_factory=list)
    started: float = 0.0

    @property
    def workers(self) -> list[int]:
        """Return the worker ranks, 1..N-1."""
        return list(range(1, self.world_size))

    @property
    def staleness(self) -> dict[int, list[int]]:
        """Return ``{worker: staleness of each of its applied gradients}`` (in updates)."""
        return {w: [a["staleness"] for a in self.applied if a["worker"] == w] for w in self.workers}

    @property
    def applied_per_worker(self) -> dict[int, int]:
        """Return how many of each worker's gradients the server applied."""
        return {w: sum(a["worker"] == w for a in self.applied) for w in self.workers}

    @property
    def staleness_limit(self) -> int | None:
        """Return the most updates a gradient may be old under this run's bound (None: no bound)."""
        return staleness_limit(self.staleness_bound, self.world_size - 1)

    def summary(self) -> list[dict[str, Any]]:
        """Return one row per worker: steps, applied, median phase ms, total waiting, staleness."""
        rows = []
        for w in self.workers:
            mine = [r for r in self.records if r["rank"] == w]
            stale = self.staleness[w] or [0]
            row: dict[str, Any] = {
                "rank": w,
                "steps": self.steps.get(w, 0),
                "applied": self.applied_per_worker[w],
            }
            for phase in WORKER_PHASES:
                spans = [r[f"{phase}_at"][1] - r[f"{phase}_at"][0] for r in mine] or [0.0]
                row[f"{phase}_ms"] = 1e3 * statistics.median(spans)
            row["waited_s"] = sum(r["wait_at"][1] - r["wait_at"][0] for r in mine)
            row["mean_staleness"], row["max_staleness"] = statistics.mean(stale), max(stale)
            row["dead"] = w in self.dead
            rows.append(row)
        return rows

    def table(self) -> str:
        """Return the per-worker summary as text, headed by the scheme and the link."""
        kind = "emulated" if self.emulated else "measured"
        head = (
            f"{self.scheme} on {self.label} ({kind}); server applied {len(self.applied)} gradients"
        )
        cols = f"{'rank':>4} {'steps':>6} {'applied':>7} {'compute':>9} {'wait':>8} {'pull':>7} "
        cols += f"{'push':>7} {'waited':>8} {'stale mean':>10} {'max':>4}"
        lines = [head, cols, "-" * len(cols)]
        for r in self.summary():
            lines.append(
                f"{r['rank']:>4} {r['steps']:>6} {r['applied']:>7} {r['compute_ms']:>7.1f}ms "
                f"{r['wait_ms']:>6.1f}ms {r['pull_ms']:>5.1f}ms {r['push_ms']:>5.1f}ms "
                f"{r['waited_s']:>7.2f}s {r['mean_staleness']:>10.2f} {r['max_staleness']:>4}"
                + ("  DEAD" if r["dead"] else "")
            )
        return "\n".join(lines)

    def plot_timeline(self, seconds: tuple[float, float] | None = None) -> Figure:
        """Return a Gantt chart: each worker's phases and the server's applies, per rank.

        ``seconds`` is a window since the run began (default: the first 0.5 s of work).
        """
        lo, hi = seconds if seconds is not None else (0.0, 0.5)
        fig = Figure(figsize=(8, 0.9 + 0.6 * self.world_size), dpi=100)
        ax = fig.subplots()
        seen: set[str] = set()

        def bar(y: int, phase: str, span: tuple[float, float], label: str) -> None:
            a, b = span[0] - self.started, span[1] - self.started
            if b > lo and a < hi and b > a:
                ax.barh(
                    y,
                    1e3 * (b - a),
                    left=1e3 * a,
                    height=0.5,
                    color=_COLORS[phase],
                    label=None if phase in seen else label,
                )
                seen.add(phase)

        for a in self.applied:
            bar(0, "apply", a["apply_at"], "server applies a gradient")
        for r in self.records:
            for phase, label in WORKER_PHASES.items():
                bar(r["rank"], phase, r[f"{phase}_at"], label)
        ax.set_xlim(1e3 * lo, 1e3 * hi)
        ranks = range(self.world_size)
        ax.set_yticks(list(ranks), ["rank 0 (server)"] + [f"rank {w}" for w in self.workers])
        ax.invert_yaxis()
        ax.set_xlabel("ms since the run began")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.set_title(f"{self.scheme}: {self.label}", fontsize=9)
        fig.tight_layout()
        return fig

    def plot_staleness(self) -> Figure:
        """Return a histogram per worker of the staleness (in updates) of its applied gradients."""
        fig = Figure(figsize=(6, 3), dpi=100)
        ax = fig.subplots()
        top = max((a["staleness"] for a in self.applied), default=0)
        bins = [b - 0.5 for b in range(top + 2)]
        for w, values in self.staleness.items():
            ax.hist(values, bins=bins, alpha=0.6, label=f"rank {w}")
        if self.staleness_limit is not None:
            ax.axvline(
                self.staleness_limit + 0.5,
                color="black",
                ls="--",
                label=f"SSP limit (W-1)(2s+1) = {self.staleness_limit}",
            )
        ax.set_xlabel("staleness (updates applied since the worker read the weights)")
        ax.set_ylabel("gradients")
        ax.legend(fontsize=8)
        ax.set_title(self.scheme, fontsize=9)
        fig.tight_layout()
        return fig

    def plot_accuracy(self, x: str = "updates") -> Figure:
        """Return test accuracy against applied updates (``x="updates"``) or wall time (``"seconds"``)."""
        if x not in ("updates", "seconds"):
            raise ValueError(f"x={x!r}: choose 'updates' or 'seconds'")
        fig = Figure(figsize=(5, 3), dpi=100)
        ax = fig.subplots()
        ax.plot(
            [h[x] for h in self.history],
            [h["test_accuracy"] for h in self.history],
            "o-",
            ms=3,
            label=self.scheme,
        )
        ax.set_xlabel("gradients applied" if x == "updates" else "seconds since the run began")
        ax.set_ylabel("test accuracy")
        ax.legend(fontsize=8)
        fig.tight_layout()
        return fig

    def __repr__(self) -> str:
        dead = f", dead workers {self.dead}" if self.dead else ""
        acc = f", test accuracy {self.history[-1]['test_accuracy']:.3f}" if self.history else ""
        return (
            f"<AsyncResult {self.scheme}, {self.world_size - 1} workers, "
            f"{len(self.applied)} gradients applied{acc}{dead}>"
        )
