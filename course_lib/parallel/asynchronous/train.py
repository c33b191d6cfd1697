"""Lecture 5: Asynchronous and stale-synchronous training from the notebook in one call.

::

    result = train_asynchronous(cluster, model="mlp", dataset=load_digits, test_set=test,
                                config=TrainConfig(num_epochs=2, batch_size=64, lr=0.05),
                                staleness_bound=None, stragglers={2: 0.25})
    result.table(), result.plot_timeline(), result.plot_staleness(), result.dead

Rank 0 is the parameter server: it holds the weights and the optimiser and applies every
worker's gradient as it arrives (Dean et al. 2012). Ranks 1..N-1 are workers: pull weights,
compute a gradient on their own shard, push it, repeat; nobody waits for anybody, so a slow
worker slows only itself, and its gradients arrive *stale* (computed on weights that several
updates have since changed). ``staleness_bound=s`` makes it stale-synchronous (Ho et al. 2013):
a worker more than ``s`` steps ahead of the slowest one is held back; ``s = 0`` is the
bulk-synchronous order. A worker that dies or falls silent is dropped and reported by rank;
the others finish the run. The engine side is :mod:`course_lib.parallel.asynchronous.engine`, the
bookkeeping :mod:`course_lib.parallel.asynchronous.staleness`.
"""

from __future__ import annotations

import time
from typing import Any

from course_lib.comm.emulated_link import EmulatedLink
from course_lib.parallel.asynchronous import engine as async_engine
from course_lib.parallel.asynchronous.result import AsyncResult
from course_lib.parallel.asynchronous.staleness import validate_bound
from course_lib.parallel.data_parallel import replica
from course_lib.parallel.data_parallel.engines import (
    COMM_NAME,
    DataParallelError,
    check_replicas_alike,
    describe_rank,
    engine_alive,
    ensure_communicators,
    first_error_line,
    run_on_engines,
    select_engines,
)
from course_lib.parallel.data_parallel.stragglers import parse_stragglers
from course_lib.parallel.data_parallel.train import validate_config
from course_lib.training.loop import TrainConfig

__all__ = ["AsyncResult", "AsyncTrainingError", "scheme_name", "train_asynchronous"]


class AsyncTrainingError(DataParallelError):
    """The server failed, or a rank hung; the message names ranks, engines and hosts."""


def scheme_name(bound: int | None) -> str:
    """Return the scheme's name for ``staleness_bound``: asynchronous, SSP or BSP order."""
    if bound is None:
        return "asynchronous"
    return "bulk-synchronous order (SSP s=0)" if bound == 0 else f"stale-synchronous (s={bound})"


def _validate_async(config: TrainConfig, n: int, options: dict[str, Any]) -> None:
    if n < 2:
        raise ValueError(
            f"world_size={n}: an asynchronous run needs a server (rank 0) and at least one "
            "worker; start at least 2 engines"
        )
    validate_config(config, n - 1)  # the global batch is split over the workers
    if config.target is not None:
        raise ValueError("target= is not supported here: the run ends after num_updates")
    validate_bound(options["staleness_bound"])
    for key in ("num_updates", "eval_every"):
        if options[key] is not None and (not isinstance(options[key], int) or options[key] < 1):
            raise ValueError(f"{key}={options[key]!r}: give a whole number >= 1 (or None)")
    if not options["worker_timeout"] > 0:
        raise ValueError(f"worker_timeout={options['worker_timeout']}: give seconds > 0")
    if 0 in options["stragglers"]:
        raise ValueError("stragglers: rank 0 is the server; slow down a worker (ranks 1..N-1)")


def _run_tolerant(
    cluster: Any, ids: list[int], fn: Any, args: tuple, timeout: float
) -> tuple[list[Any], dict[int, str]]:
    """Run ``fn`` on the engines; return results (None for lost ranks) and ``{rank: why}``.

    Workers may die or fail: they are reported, not raised. The server (rank 0) failing, or any
    rank still running at ``timeout``, raises :class:`AsyncTrainingError` (hung engines are
    recovered first).
    """
    import ipyparallel as ipp

    pending = [cluster.client[eid].apply_async(fn, *args) for eid in ids]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.client.wait(pending, timeout=0.5)
        waiting = [r for r, p in enumerate(pending) if not p.ready()]
        if all(not engine_alive(cluster, ids[r]) for r in waiting):
            break
    results: list[Any] = [None] * len(ids)
    lost: dict[int, str] = {}
    hung = []
    for rank, p in enumerate(pending):
        if not engine_alive(cluster, ids[rank]):
            lost[rank] = f"{describe_rank(cluster, ids, rank)} died"
        elif not p.ready():
            hung.append(rank)
        else:
            try:
                results[rank] = p.get(timeout=0)
            except ipp.error.EngineError:
                lost[rank] = f"{describe_rank(cluster, ids, rank)} died"
            except ipp.error.RemoteError as exc:
                lost[rank] = f"{describe_rank(cluster, ids, rank)} raised {first_error_line(exc)}"
    if lost or hung:  # their peers' communicators saw a failure: the next run makes new ones
        survivors = [ids[r] for r in range(len(ids)) if r not in lost and r not in hung]
        if survivors:
            cluster.client[survivors].apply_sync(replica.engine_comm_key, "")
    if hung:
        report = cluster.recover()
        raise AsyncTrainingError(
            f"ranks {hung} did not finish within {timeout:g} s; recovered: {report}"
        )
    if 0 in lost:
        raise AsyncTrainingError(
            f"the server failed: {lost[0]}; restart the engines (cluster.recover()) and re-run"
        )
    return results, lost


def train_asynchronous(
    cluster: Any,
    *,
    model: Any,
    dataset: Any,
    config: TrainConfig,
    staleness_bound: int | None = None,
    stragglers: dict[int, Any] | None = None,
    test_set: Any = None,
    num_updates: int | None = None,
    eval_every: int | None = None,
    backend: str = "gloo",
    link: EmulatedLink | None = None,
    world_size: int | None = None,
    worker_timeout: float = 30.0,
    comm_timeout: float = 60.0,
    timeout: float = 600.0,
) -> AsyncResult:
    """Train with an asynchronous (or stale-synchronous) parameter server; return what happened.

    Args:
        cluster: a ``CourseCluster``; rank 0 of the first ``world_size`` engines serves.
        model, dataset: as for :func:`~course_lib.parallel.data_parallel.train.train_data_parallel`.
        config: ``batch_size`` is split over the workers (each gradient uses ``B / (N-1)``
            samples); ``lr``, ``momentum``, ``optimizer`` are the server's optimiser.
        staleness_bound: None (asynchronous) or ``s >= 0``: a worker more than ``s`` steps
            ahead of the slowest live worker waits (SSP; 0 is the bulk-synchronous order).
        stragglers: ``{rank: speed fraction or Straggler}`` for workers, e.g. ``{2: 0.25}``.
        num_updates: gradients the server applies in all (default: as many as
            ``num_epochs`` epochs of bulk-synchronous training would, ``epochs * steps * (N-1)``).
        eval_every: evaluate on ``test_set`` every this many updates (default: 20 points).
        worker_timeout: seconds of silence after which the server drops a worker.
        comm_timeout, timeout: one message's limit, and the whole run's.
    """
    ids = select_engines(cluster, world_size)
    n = len(ids)
    spec = parse_stragglers(stragglers, n)
    options = {
        "staleness_bound": staleness_bound,
        "num_updates": num_updates,
        "eval_every": eval_every,
        "worker_timeout": worker_timeout,
        "stragglers": spec,
    }
    _validate_async(config, n, options)
    ensure_communicators(cluster, ids, backend, link, comm_timeout)
    prepare = (model, dataset, config.seed, COMM_NAME)
    infos = run_on_engines(cluster, ids, replica.engine_prepare, prepare, timeout)
    check_replicas_alike(cluster, ids, infos, config)
    budget = num_updates or config.num_epochs * (infos[0]["num_samples"] // config.batch_size) * (
        n - 1
    )
    every = eval_every or max(1, budget // 20)
    args = (config, staleness_bound, budget, spec, COMM_NAME, test_set, every, worker_timeout)
    results, lost = _run_tolerant(cluster, ids, async_engine.engine_async, args, timeout)
    server = results[0]
    reports = dict(lost)
    for w, why in server["lost"].items():
        reports[w] = f"{reports[w]}; the server: {why}" if w in reports else why
    if server["lost"] and not lost:  # the server lost them, their engines still answer
        cluster.client[ids].apply_sync(replica.engine_comm_key, "")
    if len(reports) == n - 1:
        raise AsyncTrainingError(
            f"every worker was lost after {server['version']} of {budget} updates: "
            + "; ".join(f"rank {w}: {why}" for w, why in sorted(reports.items()))
        )
    records = [rec for r in results[1:] if r is not None for rec in r["records"]]
    steps = {w: sum(rec["rank"] == w for rec in records) for w in range(1, n)}
    for w in reports:  # a lost worker's own records died with it: count what the server saw
        steps[w] = max(steps[w], server["clocks"].get(w, 0))
    return AsyncResult(
        scheme=scheme_name(staleness_bound),
        staleness_bound=staleness_bound,
        world_size=n,
        label=server["label"],
        emulated=server["emulated"],
        history=server["history"],
        applied=server["applies"],
        records=records,
        steps=steps,
        dead=sorted(reports),
        dead_reports=reports,
        weights=server["weights"],
        stragglers=spec,
        engines=[{"rank": i["rank"], "engine": ids[i["rank"]], "host": i["host"]} for i in infos],
        started=server["started"],
    )
