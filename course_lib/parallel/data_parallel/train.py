"""Lecture 4: Data-parallel training from the notebook in one call: every engine a replica, one method.

::

    result = train_data_parallel(cluster, model=MLP, dataset=load_digits,
                                 config=TrainConfig(num_epochs=2, batch_size=64), method="ring")
    result.replicas_equal, result.table(), result.plot_timeline()

Source 000's algorithm: the data is split among the ranks in advance (each rank takes its part
of every global batch), rank 0's network is copied to every rank, then each step every rank
computes gradients on its part, the gradients are exchanged (the method: a
:class:`~course_lib.parallel.exchanges.base.GradientExchange`, given as an instance or by its name
in :data:`~course_lib.parallel.exchanges.registry.EXCHANGES`) and every rank applies the same mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from course_lib.comm.emulated_link import EmulatedLink
from course_lib.parallel.data_parallel import replica
from course_lib.parallel.data_parallel.accounting import format_table, summarize_steps
from course_lib.parallel.data_parallel.checkpointing import prepare_checkpointing
from course_lib.parallel.data_parallel.engines import (
    COMM_NAME,
    DataParallelError,
    check_replicas_alike,
    ensure_communicators,
    run_on_engines,
    select_engines,
)
from course_lib.parallel.data_parallel.stragglers import Straggler, parse_stragglers
from course_lib.parallel.exchanges.base import GradientExchange
from course_lib.parallel.exchanges.registry import make_exchange
from course_lib.training.loop import History, TrainConfig

__all__ = ["COMM_NAME", "DataParallelError", "DataParallelResult", "train_data_parallel",
           "valid_batch_sizes", "validate_config"]  # fmt: skip


@dataclass
class DataParallelResult:
    """What a run returns: per-rank histories and step records, weights, the replica check."""

    method: str
    world_size: int
    label: str
    emulated: bool
    histories: list[History]
    records: list[dict[str, Any]]
    weights: dict[str, np.ndarray]
    replicas_equal: bool
    max_replica_difference: float
    engines: list[dict[str, Any]] = field(default_factory=list)
    gradient_bytes: int = 0
    #: Bytes of presence flags that ride with the gradient (one float32 per trainable tensor,
    #: a float16 in a compressed float16 allreduce; 0 for methods without them): what a rank's exchange buffer adds to ``gradient_bytes``.
    flag_bytes: int = 0
    #: ``{rank: Straggler}`` of the run: those ranks were slowed down on purpose (emulated).
    stragglers: dict[int, Straggler] = field(default_factory=dict)
    #: What rank 0 sent to the progress bar while it trained (``progress=True`` and a method
    #: with ``live_notes``): ``{"step": k, note: value}``, the values of record ``k`` as shown.
    published: list[dict[str, Any]] = field(default_factory=list)
    #: Each rank's communicator counts, by rank: ``(set-up, steps)``, each ``comm.stats.as_rows()``
    #: (the built-ins and the traffic per peer): the set-up is the broadcast of rank 0's weights
    #: and the method's attaching, the steps all the rest. What a grader holds against the wire.
    counters: list[tuple[Any, Any]] = field(default_factory=list)

    @property
    def history(self) -> History:
        """Return rank 0's history (test metrics are the same on every rank)."""
        return self.histories[0]

    def summary(self, stat: str = "median") -> list[dict[str, Any]]:
        """Return one row per rank: median (or ``stat="mean"``) phase seconds and bytes per step."""
        return summarize_steps(self.records, stat=stat)

    @property
    def straggler_label(self) -> str:
        """Return e.g. ``"emulated stragglers: rank 2 at 0.5x speed"`` ('' without stragglers)."""
        parts = [
            f"rank {r} at {s.speed:g}x speed" + (f" + {s.delay * 1e3:g} ms" if s.delay else "")
            for r, s in sorted(self.stragglers.items())
        ]
        return "emulated stragglers: " + ", ".join(parts) if parts else ""

    def table(self, stat: str = "median") -> str:
        """Return the per-rank summary as text, labelled with the method, the link and ``stat``.

        ``stat="mean"`` averages over all steps, so communication that happens on only some
        steps (Local-SGD's averaging) shows; the median shows a typical step.
        """
        kind = "emulated" if self.emulated else "measured"
        slow = f"; {self.straggler_label}" if self.stragglers else ""
        head = f"{self.method} on {self.label} ({kind}{slow}), {stat} per step:"
        return head + "\n" + format_table(self.summary(stat))

    def drift(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(steps, distances)``: steps done at each measurement, and one column per rank.

        ``distances[k, r]`` is rank ``r``'s L2 distance from the mean of the replicas after
        ``steps[k]`` steps (empty unless the run had ``measure_drift_every``).
        """
        rows = sorted((r["step"] + 1, r["rank"], r["drift"]) for r in self.records if "drift" in r)
        steps = sorted({s for s, _, _ in rows})
        out = np.zeros((len(steps), self.world_size))
        where = {s: k for k, s in enumerate(steps)}
        for s, rank, d in rows:
            out[where[s], rank] = d
        return np.array(steps), out

    def plot_breakdown(self) -> Figure:
        """Return a stacked bar per rank of the median step's phases."""
        from course_lib.parallel.data_parallel.timeline import plot_breakdown

        slow = f"; {self.straggler_label}" if self.stragglers else ""
        return plot_breakdown(self.summary(), title=f"{self.method}: {self.label}{slow}")

    def plot_timeline(self, steps: tuple[int, int] | None = None, ax: Any = None) -> Figure:
        """Return a Gantt chart per rank of ``steps`` (default: the last two steps), drawn into
        ``ax`` when given."""
        from course_lib.parallel.data_parallel.timeline import plot_timeline

        slow = f"; {self.straggler_label}" if self.stragglers else ""
        title = f"{self.method}: {self.label}{slow}"
        return plot_timeline(self.records, steps=steps, title=title, ax=ax)

    def __repr__(self) -> str:
        same = "equal" if self.replicas_equal else f"DIFFER by {self.max_replica_difference:.2e}"
        return (
            f"<DataParallelResult {self.method!r}, {self.world_size} ranks, "
            f"{len(self.records) // max(self.world_size, 1)} steps, replicas {same}>"
        )


def valid_batch_sizes(world_size: int, near: int, count: int = 3) -> list[int]:
    """Return ``count`` global batch sizes near ``near`` that split evenly over ``world_size``."""
    low = max(world_size, near // world_size * world_size)
    return [low + k * world_size for k in range(count)]


def validate_config(config: TrainConfig, world_size: int) -> None:
    """Raise ValueError naming the fix when ``config`` cannot be trained on ``world_size`` ranks."""
    if config.batch_size % world_size:
        raise ValueError(
            f"batch_size={config.batch_size} (the global batch) cannot be split over "
            f"{world_size} ranks: use a multiple of {world_size}, e.g. "
            f"{valid_batch_sizes(world_size, config.batch_size)}"
        )
    if config.target is not None and not config.target_metric.startswith("test_"):
        raise ValueError(
            f"target_metric={config.target_metric!r} is measured on each rank's own shard, so "
            "ranks could stop at different epochs; use a test_ metric (pass test_set=...)"
        )


def train_data_parallel(
    cluster: Any,
    *,
    model: Any,
    dataset: Any,
    config: TrainConfig,
    method: str | GradientExchange = "ring",
    backend: str = "gloo",
    link: EmulatedLink | None = None,
    world_size: int | None = None,
    test_set: Any = None,
    measure_wait: bool = True,
    stragglers: dict[int, float | Straggler] | None = None,
    measure_drift_every: int = 0,
    comm_timeout: float = 60.0,
    timeout: float = 600.0,
    checkpoint: Any = None,
    resume_from: Any = None,
    progress: bool = False,
    **options: Any,
) -> DataParallelResult:
    """Train one replica per engine with gradient exchange ``method``; return what happened.

    Args:
        cluster: a ``CourseCluster``; the first ``world_size`` engines (default: all) train.
        model: an ``nn.Module`` (copied), a model name (``"mlp"``) or a function building one.
        dataset: a ``Dataset`` or a function returning one; every engine must see the same set.
        config: ``batch_size`` is the *global* batch, split evenly over the ranks.
        method: a ``GradientExchange`` instance (one defined in the notebook travels to the
            engines by value; each engine gets a fresh copy), or a name in ``EXCHANGES``
            (``list(EXCHANGES)``; ``options`` are then its constructor's settings).
        backend, link: the communicator (``"gloo"`` or ``"mpi"``), optionally emulating ``link``.
        measure_wait: time a barrier where the method waits for every rank ("waiting").
        stragglers: ``{rank: speed fraction or Straggler}``: slow those ranks down on purpose
            (emulated; they sleep after each backward), e.g. ``{2: 0.5}`` for half speed.
        measure_drift_every: every k steps, measure each replica's distance from the mean of
            the replicas (an extra allreduce not counted as the method's); ``result.drift()``.
        comm_timeout: seconds any one message may take before the ranks give up, naming a rank.
        timeout: seconds for the whole run before hung engines are recovered.
        checkpoint: a folder (or ``CheckpointConfig``) every engine can read: rank 0 saves the
            whole run there after every epoch (and every ``every_steps`` steps), keeping 2.
        resume_from: a checkpoint file or folder (its newest): continue that run, bit for bit on
            the same world size (mid-epoch too), on another one only from an epoch boundary
            (:mod:`course_lib.parallel.data_parallel.checkpointing` says which methods allow it).
        progress: show a bar of rank 0's steps while the engines train (for long notebook cells),
            with the method's ``live_notes`` (the noise scale of ``NoiseScaleExchange``).
        options: the method's settings, e.g. ``bucket_bytes=4096`` for ``bucketed``.
    """
    ids = select_engines(cluster, world_size)
    n = len(ids)
    exchange = make_exchange(method, **options)  # bad names or options fail before any engine
    validate_config(config, n)
    slow = parse_stragglers(stragglers, n)
    if (
        isinstance(measure_drift_every, bool)
        or not isinstance(measure_drift_every, int)
        or measure_drift_every < 0
    ):
        raise ValueError(
            f"measure_drift_every={measure_drift_every!r}: give a step count >= 1, "
            "or 0 for no drift measurement"
        )
    saver, resume_file, resumed_at = prepare_checkpointing(exchange, checkpoint, resume_from, n)
    if saver or resume_file:
        exchange = exchange.for_saved_run()  # a saved run must repeat itself bit for bit
    ensure_communicators(cluster, ids, backend, link, comm_timeout)
    prepare = (model, dataset, config.seed, COMM_NAME)
    infos = run_on_engines(cluster, ids, replica.engine_prepare, prepare, timeout)
    check_replicas_alike(cluster, ids, infos, config)
    spec = replica.RunSpec(
        config,
        exchange,
        COMM_NAME,
        measure_wait,
        test_set,
        slow,
        measure_drift_every,
        saver,
        resume_file,
        resumed_at,
    )
    label = f"{exchange.name} on {n} engines" if progress else ""
    published: list[dict[str, Any]] = []
    results = run_on_engines(
        cluster,
        ids,
        replica.engine_train,
        (spec,),
        timeout,
        label,
        exchange.live_notes,
        published,
    )
    weights = results[0]["weights"]
    diffs = [
        max(float(np.abs(r["weights"][k] - w).max(initial=0.0)) for k, w in weights.items())
        for r in results
    ]
    return DataParallelResult(
        method=exchange.name,
        world_size=n,
        label=results[0]["label"],
        emulated=results[0]["emulated"],
        histories=[History(epochs=r["epochs"], step_times=r["step_times"]) for r in results],
        records=[rec for r in results for rec in r["records"]],
        weights=weights,
        replicas_equal=max(diffs) == 0.0,
        max_replica_difference=max(diffs),
        engines=[{"rank": i["rank"], "engine": ids[i["rank"]], "host": i["host"]} for i in infos],
        gradient_bytes=results[0]["param_bytes"],
        flag_bytes=results[0]["flag_bytes"],
        stragglers=slow,
        published=published,
        counters=[r["counters"] for r in sorted(results, key=lambda r: r["rank"])],
    )
