"""Lecture 4: Run one function on a set of engines as ranks, and turn deaths, errors and hangs into one error.

What every training scheme that runs on the engines shares (data-parallel steps, the
asynchronous parameter server): pick the engines, make sure each has its communicator, ship a
function to all of them, and report a failure by rank, engine and host instead of hanging.
"""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace
from typing import Any

from course_lib.cluster.engine_death import next_step_after_a_death
from course_lib.comm.setup import setup_communicators
from course_lib.parallel.data_parallel import replica
from course_lib.training.loop import TrainConfig

__all__ = [
    "COMM_NAME",
    "DataParallelError",
    "check_replicas_alike",
    "describe_rank",
    "engine_alive",
    "ensure_communicators",
    "first_error_line",
    "run_on_engines",
    "same_errors_together",
    "select_engines",
]

COMM_NAME = "dp_comm"  # the communicator's name in every engine's namespace


class DataParallelError(RuntimeError):
    """A data-parallel run failed on the engines; the message names the ranks, engines and hosts."""


def select_engines(cluster: Any, world_size: int | None) -> list[int]:
    """Return the ids of the first ``world_size`` engines by rank (default: all of them)."""
    ids = list(cluster.ids_by_rank)
    n = len(ids) if world_size is None else world_size
    if not 1 <= n <= len(ids):
        raise ValueError(f"world_size={world_size}: the cluster has {len(ids)} engines")
    return ids[:n]


def ensure_communicators(
    cluster: Any, ids: list[int], backend: str, link: Any, timeout: float
) -> None:
    """Create ``dp_comm`` on the engines unless the same set-up is already there."""
    key = repr((backend, ids, link, timeout))
    view = cluster.client[ids]
    if all(k == key for k in view.apply_sync(replica.engine_comm_key)):
        return
    sub = SimpleNamespace(client=cluster.client, ids_by_rank=ids, engine_info=cluster.engine_info)
    setup_communicators(sub, backend=backend, link=link, name=COMM_NAME, timeout=timeout)
    view.apply_sync(replica.engine_comm_key, key)


def describe_rank(cluster: Any, ids: list[int], rank: int) -> str:
    """Return "rank r (engine e on host h, pid p)" for messages that must name the culprit."""
    info = cluster.engine_info.get(ids[rank], {})
    return f"rank {rank} (engine {ids[rank]} on host {info.get('host', '?')}, pid {info.get('pid', '?')})"


def engine_alive(cluster: Any, eid: int) -> bool:
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


def _show_progress(
    bar: Any,
    data: dict[str, Any],
    label: str,
    live_labels: dict[str, str] | None = None,
    published: list[dict[str, Any]] | None = None,
) -> Any:
    """Create or advance the notebook's bar from what rank 0 published; return the bar.

    Values rank 0 sent along (``data["live"]``, e.g. the noise scale) go on the bar's line as
    ``live_labels`` names them and, once per step, into ``published``.
    """
    if "steps_total" not in data:
        return bar
    if bar is None:
        from tqdm.auto import tqdm

        bar = tqdm(total=data["steps_total"], desc=label, unit="step", leave=False, mininterval=0)
    live = data.get("live")
    if live and (published is None or not published or published[-1]["step"] != live["step"]):
        if published is not None:
            published.append(dict(live))
        labels = live_labels or {}
        shown = [f"{labels.get(k, k)} {v:.4g}" for k, v in live.items() if k != "step"]
        bar.set_postfix_str(f"step {live['step']}: " + ", ".join(shown), refresh=False)
    bar.update(data["steps_done"] - bar.n)
    return bar


def first_error_line(exc: BaseException) -> str:
    """Return the first line of a (remote) exception as "Name: message", at most 400 characters."""
    text = f"{getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', exc)}"
    return text.strip().splitlines()[0][:400]


def run_on_engines(
    cluster: Any,
    ids: list[int],
    fn: Any,
    args: tuple,
    timeout: float,
    progress: str = "",
    live_labels: dict[str, str] | None = None,
    published: list[dict[str, Any]] | None = None,
) -> list[Any]:
    """Run ``fn`` on the engines ``ids``; turn deaths, errors and hangs into DataParallelError.

    ``progress``: a label; when given, a bar (tqdm: a widget in Jupyter) follows the steps that
    rank 0 publishes while it trains (``replica.StepsPublished``), with the values it sends
    along (``live_labels`` names them); each one seen is appended to ``published``.
    """
    import ipyparallel as ipp

    pending = [cluster.client[eid].apply_async(fn, *args) for eid in ids]
    deadline = time.monotonic() + timeout
    gone: list[int] = []
    bar = None
    try:
        while time.monotonic() < deadline:
            # returns early once all are done; a bar polls faster, to catch what rank 0 sends
            cluster.client.wait(pending, timeout=0.1 if progress else 0.5)
            if progress:
                bar = _show_progress(bar, pending[0].data, progress, live_labels, published)
            waiting = [r for r, p in enumerate(pending) if not p.ready()]
            gone = [r for r in waiting if not engine_alive(cluster, ids[r])]
            if len(gone) == len(waiting):  # all done, or all that are not done are dead
                break
        if progress and pending[0].ready():  # its last count may follow the result: wait for it
            pending[0].wait_for_output(timeout=5)
            bar = _show_progress(bar, pending[0].data, progress, live_labels, published)
    finally:
        if bar is not None:
            bar.close()
    died, failed, hung = [], [], []
    for rank, p in enumerate(pending):
        if not engine_alive(cluster, ids[rank]):
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
        parts += [f"{describe_rank(cluster, ids, r)} died{when}" for r in died]
        if failed:  # the survivors' errors only echo the death (their collective lost a peer)
            parts.append(f"ranks {[r for r, _ in failed]} stopped with it")
            failed = []
        parts.append(next_step_after_a_death(cluster))
    if hung:
        report = cluster.recover()
        parts.append(f"ranks {hung} did not finish within {timeout:g} s; recovered: {report}")
    parts += same_errors_together(failed)
    raise DataParallelError("data-parallel run failed: " + "; ".join(parts))


def same_errors_together(failed: list[tuple[int, BaseException]], limit: int = 400) -> list[str]:
    """Return one line per distinct error, naming every rank that raised it (each cut to ``limit``)."""
    ranks_by_error: dict[str, list[int]] = {}
    for rank, exc in failed:
        ranks_by_error.setdefault(first_error_line(exc)[:limit], []).append(rank)
    return [
        f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))} raised {error}"
        for error, ranks in ranks_by_error.items()
    ]


def check_replicas_alike(
    cluster: Any, ids: list[int], infos: list[dict[str, Any]], config: TrainConfig
) -> None:
    """Raise ValueError naming the ranks whose model or data set differ from rank 0's."""
    ref = infos[0]
    for info in infos[1:]:
        mine, theirs = info["fingerprint"], ref["fingerprint"]
        if mine != theirs:
            diff = next(
                (f"{a} vs rank 0's {b}" for a, b in zip(mine, theirs, strict=False) if a != b),
                f"{len(mine)} tensors vs rank 0's {len(theirs)}",
            )
            bad = [
                describe_rank(cluster, ids, i["rank"]) for i in infos if i["fingerprint"] != theirs
            ]
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
