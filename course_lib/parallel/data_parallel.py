"""Data-parallel training from the notebook in one call: every engine a replica, one method.

::

    result = train_data_parallel(cluster, model=MLP, dataset=load_digits,
                                 config=TrainConfig(num_epochs=2, batch_size=64), method="ring")
    result.replicas_equal, result.table(), result.plot_timeline()

Source 000's algorithm: the data is split among the ranks in advance (each rank takes its part
of every global batch), rank 0's network is copied to every rank, then each step every rank
computes gradients on its part, the gradients are exchanged (the method, chosen by name from
:data:`~course_lib.parallel.registry.EXCHANGES`) and every rank applies the same mean.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from course_lib.comm.emulated_link import EmulatedLink
from course_lib.comm.setup import setup_communicators
from course_lib.parallel import replica
from course_lib.parallel.accounting import format_table, summarize_steps
from course_lib.parallel.registry import EXCHANGES
from course_lib.parallel.stragglers import Straggler, parse_stragglers
from course_lib.training import History, TrainConfig

__all__ = ["COMM_NAME", "DataParallelError", "DataParallelResult", "train_data_parallel",
           "valid_batch_sizes"]  # fmt: skip

COMM_NAME = "dp_comm"  # the communicator's name in every engine's namespace


class DataParallelError(RuntimeError):
    """A data-parallel run failed on the engines; the message names the ranks, engines and hosts."""


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
    #: ``{rank: Straggler}`` of the run: those ranks were slowed down on purpose (emulated).
    stragglers: dict[int, Straggler] = field(default_factory=dict)

    @property
    def history(self) -> History:
        """Return rank 0's history (test metrics are the same on every rank)."""
        return self.histories[0]

    def summary(self) -> list[dict[str, Any]]:
        """Return one row per rank: median phase seconds and bytes per step."""
        return summarize_steps(self.records)

    @property
    def straggler_label(self) -> str:
        """Return e.g. ``"emulated stragglers: rank 2 at 0.5x speed"`` ('' without stragglers)."""
        parts = [f"rank {r} at {s.speed:g}x speed" + (f" + {s.delay * 1e3:g} ms" if s.delay else "")
                 for r, s in sorted(self.stragglers.items())]  # fmt: skip
        return "emulated stragglers: " + ", ".join(parts) if parts else ""

    def table(self) -> str:
        """Return the per-rank summary as text, labelled with the method and the link."""
        kind = "emulated" if self.emulated else "measured"
        slow = f"; {self.straggler_label}" if self.stragglers else ""
        head = f"{self.method} on {self.label} ({kind}{slow}), median per step:"
        return head + "\n" + format_table(self.summary())

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
        from course_lib.parallel.timeline import plot_breakdown

        return plot_breakdown(self.summary(), title=f"{self.method}: {self.label}")

    def plot_timeline(self, steps: tuple[int, int] | None = None) -> Figure:
        """Return a Gantt chart per rank of ``steps`` (default: the last two steps)."""
        from course_lib.parallel.timeline import plot_timeline

        return plot_timeline(self.records, steps=steps, title=f"{self.method}: {self.label}")

    def __repr__(self) -> str:
        same = "equal" if self.replicas_equal else f"DIFFER by {self.max_replica_difference:.2e}"
        return (f"<DataParallelResult {self.method!r}, {self.world_size} ranks, "
                f"{len(self.records) // max(self.world_size, 1)} steps, replicas {same}>")  # fmt: skip


def valid_batch_sizes(world_size: int, near: int, count: int = 3) -> list[int]:
    """Return ``count`` global batch sizes near ``near`` that split evenly over ``world_size``."""
    low = max(world_size, near // world_size * world_size)
    return [low + k * world_size for k in range(count)]


def _validate(config: TrainConfig, method: str, world_size: int) -> None:
    if method not in EXCHANGES:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(EXCHANGES)}")
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


def _engines(cluster: Any, world_size: int | None) -> list[int]:
    ids = list(cluster.ids_by_rank)
    n = len(ids) if world_size is None else world_size
    if not 1 <= n <= len(ids):
        raise ValueError(f"world_size={world_size}: the cluster has {len(ids)} engines")
    return ids[:n]


def _ensure_communicators(cluster, ids, backend, link, timeout) -> None:
    """Create ``dp_comm`` on the engines unless the same set-up is already there."""
    key = repr((backend, ids, link, timeout))
    view = cluster.client[ids]
    if all(k == key for k in view.apply_sync(replica.engine_comm_key)):
        return
    sub = SimpleNamespace(client=cluster.client, ids_by_rank=ids, engine_info=cluster.engine_info)
    setup_communicators(sub, backend=backend, link=link, name=COMM_NAME, timeout=timeout)
    view.apply_sync(replica.engine_comm_key, key)


def _describe(cluster: Any, ids: list[int], rank: int) -> str:
    info = cluster.engine_info.get(ids[rank], {})
    return f"rank {rank} (engine {ids[rank]} on host {info.get('host', '?')}, pid {info.get('pid', '?')})"


def _alive(cluster: Any, eid: int) -> bool:
    """Return False once engine ``eid`` is known dead: unregistered, or its local process gone.

    The controller notices a killed engine only after missed heartbeats (seconds); on this PC
    the process table tells at once.
    """
    import psutil

    if eid not in cluster.client.ids:
        return False
    info = cluster.engine_info.get(eid, {})
    if info.get("host") == socket.gethostname() and info.get("pid"):
        try:
            return psutil.Process(info["pid"]).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return True


def _first_line(exc: BaseException) -> str:
    text = f"{getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', exc)}"
    return text.strip().splitlines()[0][:400]


def _run(cluster: Any, ids: list[int], fn: Any, args: tuple, timeout: float) -> list[Any]:
    """Run ``fn`` on the engines ``ids``; turn deaths, errors and hangs into DataParallelError."""
    import ipyparallel as ipp

    pending = [cluster.client[eid].apply_async(fn, *args) for eid in ids]
    deadline = time.monotonic() + timeout
    gone: list[int] = []
    while time.monotonic() < deadline:
        cluster.client.wait(pending, timeout=0.5)  # returns early once all are done
        waiting = [r for r, p in enumerate(pending) if not p.ready()]
        gone = [r for r in waiting if not _alive(cluster, ids[r])]
        if len(gone) == len(waiting):  # all done, or all that are not done are dead
            break
    died, failed, hung = [], [], []
    for rank, p in enumerate(pending):
        if not _alive(cluster, ids[rank]):
            died.append(rank)
        elif not p.ready():
            hung.append(rank)
        else:
            try:
                p.get(timeout=0)
            except ipp.error.EngineError:
                died.append(rank)
            except ipp.error.RemoteError as exc:
                failed.append((rank, exc))
    if not (died or failed or hung):
        return [p.get() for p in pending]
    survivors = [ids[r] for r in range(len(ids)) if r not in died + hung]
    if survivors:  # their communicators saw a failure: the next run creates new ones
        cluster.client[survivors].apply_sync(replica.engine_comm_key, "")
    parts = []
    if died:
        done = cluster.client[survivors].apply_sync(replica.engine_progress) if survivors else []
        when = f" after step {min(done)} of this run" if done else ""
        parts += [f"{_describe(cluster, ids, r)} died{when}" for r in died]
        parts.append("restart the engines (cluster.recover(), or start_cluster again) and re-run")
    if hung:
        report = cluster.recover()
        parts.append(f"ranks {hung} did not finish within {timeout:g} s; recovered: {report}")
    parts += [f"{_describe(cluster, ids, r)} raised {_first_line(e)}" for r, e in failed]
    raise DataParallelError("data-parallel run failed: " + "; ".join(parts))


def train_data_parallel(
    cluster: Any,
    *,
    model: Any,
    dataset: Any,
    config: TrainConfig,
    method: str = "ring",
    backend: str = "gloo",
    link: EmulatedLink | None = None,
    world_size: int | None = None,
    test_set: Any = None,
    measure_wait: bool = True,
    stragglers: dict[int, float | Straggler] | None = None,
    measure_drift_every: int = 0,
    comm_timeout: float = 60.0,
    timeout: float = 600.0,
    **options: Any,
) -> DataParallelResult:
    """Train one replica per engine with gradient exchange ``method``; return what happened.

    Args:
        cluster: a ``CourseCluster``; the first ``world_size`` engines (default: all) train.
        model: an ``nn.Module`` (copied), a model name (``"mlp"``) or a function building one.
        dataset: a ``Dataset`` or a function returning one; every engine must see the same set.
        config: ``batch_size`` is the *global* batch, split evenly over the ranks.
        method: a name in ``EXCHANGES``: ``parameter_server``, ``parameter_server_source000``,
            ``allreduce_naive``, ``ring``, ``builtin``, ``bucketed``, ``ddp``, ``local_sgd``,
            ``gossip``, ``gossip_sparse``.
        backend, link: the communicator (``"gloo"`` or ``"mpi"``), optionally emulating ``link``.
        measure_wait: time a barrier where the method waits for every rank ("waiting").
        stragglers: ``{rank: speed fraction or Straggler}``: slow those ranks down on purpose
            (emulated; they sleep after each backward), e.g. ``{2: 0.5}`` for half speed.
        measure_drift_every: every k steps, measure each replica's distance from the mean of
            the replicas (an extra allreduce not counted as the method's); ``result.drift()``.
        comm_timeout: seconds any one message may take before the ranks give up, naming a rank.
        timeout: seconds for the whole run before hung engines are recovered.
        options: the method's settings, e.g. ``bucket_bytes=4096`` for ``bucketed``.
    """
    ids = _engines(cluster, world_size)
    n = len(ids)
    _validate(config, method, n)
    slow = parse_stragglers(stragglers, n)
    if isinstance(measure_drift_every, bool) or not isinstance(measure_drift_every, int) \
            or measure_drift_every < 0:  # fmt: skip
        raise ValueError(f"measure_drift_every={measure_drift_every!r}: give a step count >= 1, "
                         "or 0 for no drift measurement")  # fmt: skip
    EXCHANGES[method](**options)  # bad options fail here, before any engine is busy
    _ensure_communicators(cluster, ids, backend, link, comm_timeout)
    infos = _run(cluster, ids, replica.engine_prepare, (model, dataset, config.seed, COMM_NAME),
                 timeout)  # fmt: skip
    _check_replicas_alike(cluster, ids, infos, config)
    args = (config, method, options, COMM_NAME, measure_wait, test_set, slow, measure_drift_every)
    results = _run(cluster, ids, replica.engine_train, args, timeout)
    weights = results[0]["weights"]
    diffs = [max(float(np.abs(r["weights"][k] - w).max(initial=0.0)) for k, w in weights.items())
             for r in results]  # fmt: skip
    return DataParallelResult(
        method=method, world_size=n, label=results[0]["label"], emulated=results[0]["emulated"],
        histories=[History(epochs=r["epochs"], step_times=r["step_times"]) for r in results],
        records=[rec for r in results for rec in r["records"]], weights=weights,
        replicas_equal=max(diffs) == 0.0, max_replica_difference=max(diffs),
        engines=[{"rank": i["rank"], "engine": ids[i["rank"]], "host": i["host"]} for i in infos],
        gradient_bytes=results[0]["param_bytes"], stragglers=slow,
    )  # fmt: skip


def _check_replicas_alike(cluster, ids, infos, config: TrainConfig) -> None:
    """Raise ValueError naming the ranks whose model or data set differ from rank 0's."""
    ref = infos[0]
    for info in infos[1:]:
        mine, theirs = info["fingerprint"], ref["fingerprint"]
        if mine != theirs:
            diff = next((f"{a} vs rank 0's {b}" for a, b in zip(mine, theirs, strict=False) if a != b),
                        f"{len(mine)} tensors vs rank 0's {len(theirs)}")  # fmt: skip
            bad = [_describe(cluster, ids, i["rank"]) for i in infos if i["fingerprint"] != theirs]
            raise ValueError(
                f"the replicas differ in shape: {', '.join(bad)} built a different model than "
                f"rank 0 (first difference: {diff}); every engine must build the same model"
            )
    sizes = {i["num_samples"] for i in infos}
    if len(sizes) > 1:
        raise ValueError(f"engines loaded data sets of different sizes {sorted(sizes)}")
    if ref["num_samples"] < config.batch_size:
        raise ValueError(
            f"the data set has {ref['num_samples']} samples, fewer than one global batch of "
            f"{config.batch_size}: use a smaller batch_size"
        )
