"""Recover a cluster whose engines hang, and keep the notebook's client alive while doing it.

The classic case is an MPI hang (ipyparallel's "Cluster API" example): one rank raises, the
others wait forever in a collective that rank never reaches. (Not a deadlock, which needs a
circular wait: nobody here waits for the ranks that wait.) A rank blocked inside MPI cannot be
interrupted (the wait is in C, where Python's SIGINT handler never runs), and its world
communicator cannot be trusted afterwards, so MPI engines are restarted together. Local engines
stuck in Python code are first interrupted with SIGINT, which keeps their variables.

MPI engines that all answer may still hold a world that is out of step (some ranks wait in a
collective on it that the others never joined): recovery asks every rank to agree on a new
communicator, and restarts the engines when they cannot. Serves lecture 0 (the cluster) and
lecture 3 (communication: recovering after a failed collective).
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import ipyparallel as ipp

from course_lib.cluster import engine_side
from course_lib.i18n import _

__all__ = [
    "EngineTimeout",
    "RecoverableCluster",
    "RecoveryReport",
    "probe_mpi_world",
    "recover",
    "run_with_timeout",
]


class RecoverableCluster(Protocol):
    """What recovery needs of a cluster (``CourseCluster`` has it; recovery never imports it)."""

    client: ipp.Client
    ids_by_rank: list[int]
    owned: ipp.Cluster | None
    engine_info: dict[int, dict[str, Any]]
    settings: Any

    @property
    def kind(self) -> str: ...

    def wait_for_fresh_engines(self, old_pids: set[int], deadline: float) -> None: ...

    def setup_engines(self) -> None: ...


class EngineTimeout(TimeoutError):
    """Engines did not answer in time; the message says which ranks hung and what was done."""

    def __init__(self, message: str, report: RecoveryReport | None = None):
        super().__init__(message)
        self.report = report


@dataclass
class RecoveryReport:
    """What :func:`recover` found and did, in words a student can act on."""

    hung_ranks: list[int] = field(default_factory=list)
    action: str = "none"  # "none", "interrupted" or "restarted"
    seconds: float = 0.0
    lost_state: bool = False
    note: str = ""  # what else was found, e.g. the state of an MPI world

    def __str__(self) -> str:
        if self.action == "none":
            text = _("all engines answered: nothing to recover")
        else:
            ranks = ", ".join(map(str, self.hung_ranks)) or _("none")
            seconds = f"{self.seconds:.1f}"
            if self.action == "restarted":
                text = _("hung ranks: {ranks}; restarted in {seconds} s")
            else:
                text = _("hung ranks: {ranks}; interrupted in {seconds} s")
            text = text.format(ranks=ranks, seconds=seconds)
        if self.lost_state:
            text += _(
                " (engines are new: variables defined on them earlier are gone, re-run setup)"
            )
        return f"{text}; {self.note}" if self.note else text


_MPI_HEALTHY = (
    "their MPI world still builds new communicators: recreate a communicator whose call failed "
    "with setup_communicators(cluster, 'mpi')"
)


def _is_mpi(cluster: RecoverableCluster) -> bool:
    infos = [cluster.engine_info.get(eid, {}) for eid in cluster.ids_by_rank]
    return bool(infos) and all(info.get("mpi_rank") is not None for info in infos)


def probe_mpi_world(timeout: float) -> bool:
    """Run on an MPI engine: return True when every rank joins a new world communicator in time."""
    from mpi4py import MPI

    probe, req = MPI.COMM_WORLD.Idup()  # nonblocking: a world out of step times out, never hangs
    deadline = time.monotonic() + timeout
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-3)
    probe.Free()  # nothing was sent on it, so no stale message can reach a later communicator
    return True


def _mpi_world_problem(cluster: RecoverableCluster, timeout: float) -> str | None:
    """Return why the engines' MPI world cannot build a communicator, or None when it can."""
    pending = [
        cluster.client[eid].apply_async(probe_mpi_world, timeout) for eid in cluster.ids_by_rank
    ]
    stuck = []
    for rank, result in enumerate(pending):
        try:
            if not result.get(timeout=timeout + 30):
                stuck.append(rank)
        except Exception:  # noqa: BLE001 - an engine that fails the probe cannot be trusted
            stuck.append(rank)
    if not stuck:
        return None
    return (
        f"ranks {stuck} could not agree on a new MPI communicator with the others: their MPI "
        "world is out of step, which MPI cannot repair, so the engines must be restarted"
    )


def _busy_ranks(cluster: RecoverableCluster) -> list[int]:
    status = cluster.client.queue_status()
    return [
        rank
        for rank, eid in enumerate(cluster.ids_by_rank)
        if isinstance(status.get(eid), dict) and status[eid].get("queue", 0) > 0
    ]


def _all_answer(cluster: RecoverableCluster, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    try:
        pending = [
            cluster.client[eid].apply_async(engine_side.engine_pid) for eid in cluster.ids_by_rank
        ]
        for result in pending:
            result.get(timeout=max(0.01, deadline - time.monotonic()))
    except Exception:  # noqa: BLE001 - timed out, died or stale: all mean "not answering"
        return False
    return True


def recover(cluster: RecoverableCluster, grace: float = 10.0) -> RecoveryReport:
    """Free hung engines: SIGINT for local engines, then a restart of all engines if needed.

    MPI engines that all answer are asked to agree on a new communicator; when they cannot (a
    collective left unfinished on some ranks), MPI cannot repair their world and they are
    restarted. Returns a report; the cluster's view, ranks and ``%px`` magics point at the live
    engines afterwards. A cluster we only connected to cannot be signalled from here: the error
    says to ask the instructor.
    """
    start = time.monotonic()
    hung = _busy_ranks(cluster)
    problem = ""
    if not hung and _all_answer(cluster, timeout=grace):
        if not _is_mpi(cluster):
            return RecoveryReport()
        # a probe that fails leaves one more unfinished collective behind: the restart clears it
        problem = _mpi_world_problem(cluster, timeout=max(grace, 10.0)) or ""
        if not problem:
            return RecoveryReport(note=_MPI_HEALTHY)
    if cluster.owned is None and not _is_mpi(cluster):
        # A connected cluster (a seat in the lab) holds only its own engines, so interrupting
        # them is safe: ipyparallel's control channel asks each engine to signal itself.
        try:
            cluster.client.send_signal("SIGINT", targets=list(cluster.ids_by_rank), block=True)
        except Exception:  # noqa: BLE001 - an engine gone or not answering: reported below
            pass
        if _all_answer(cluster, timeout=grace):
            return RecoveryReport(hung, "interrupted", time.monotonic() - start)
    seat = getattr(cluster, "seat", None)
    if cluster.owned is None and seat is not None and getattr(cluster.settings, "mpi", False):
        # The room's MPI world, held by this notebook: the lab's seat service restarts it
        # where mpiexec runs (the instructor's PC); ids change, ranks stay.
        seat.restart_mpi(timeout=max(cluster.settings.timeout, 300.0))
        cluster.setup_engines()
        return RecoveryReport(hung, "restarted", time.monotonic() - start, True, problem)
    if cluster.owned is None:
        what = problem or f"ranks {hung} are hung"
        raise EngineTimeout(
            f"{what} on a cluster this notebook did not start: ask the instructor to restart "
            "the engines (`ipcluster engines` / restart the cluster), then reconnect"
        )
    if cluster.kind != "mpi":
        try:
            cluster.owned.signal_engines_sync(signal.SIGINT)
        except Exception:  # noqa: BLE001 - psutil.NoSuchProcess etc.: an engine is already dead,
            pass  # and only the restart below can help
        if _all_answer(cluster, timeout=grace):
            return RecoveryReport(hung, "interrupted", time.monotonic() - start)
    old_pids = {info["pid"] for info in cluster.engine_info.values()}
    cluster.owned.restart_engines_sync()
    cluster.wait_for_fresh_engines(old_pids, deadline=time.monotonic() + cluster.settings.timeout)
    cluster.setup_engines()
    return RecoveryReport(hung, "restarted", time.monotonic() - start, True, problem)


def _describe_failures(results: list[Any]) -> str:
    notes = []
    for rank, result in enumerate(results):
        if result.ready():
            try:
                result.get(timeout=0)
            except ipp.error.RemoteError as exc:
                notes.append(
                    _("rank {rank} raised {name}: {value}").format(
                        rank=rank, name=exc.ename, value=exc.evalue
                    )
                )
    return "; ".join(notes)


def run_with_timeout(
    cluster: RecoverableCluster, fn: Any, args: tuple, kwargs: dict, timeout: float
) -> list[Any]:
    """Run ``fn`` on every engine; on timeout recover the cluster and raise :class:`EngineTimeout`."""
    gone = [rank for rank, eid in enumerate(cluster.ids_by_rank) if eid not in cluster.client.ids]
    if gone:
        report = recover(cluster)
        raise EngineTimeout(
            _(
                "the engines of ranks {gone} are gone (died or were stopped); nothing was run. "
                "Recovered: {report}"
            ).format(gone=gone, report=report),
            report,
        )
    results = [cluster.client[eid].apply_async(fn, *args, **kwargs) for eid in cluster.ids_by_rank]
    deadline = time.monotonic() + timeout
    for result in results:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            result.wait(remaining)
        if not result.ready():
            hung = [rank for rank, r in enumerate(results) if not r.ready()]
            failures = _describe_failures(results)
            report = recover(cluster)
            why = (
                _(" ({failures}: the others waited for a rank that never came, a hang)").format(
                    failures=failures
                )
                if failures
                else ""
            )
            raise EngineTimeout(
                _(
                    "ranks {hung} did not answer within {seconds} s{why}. Recovered: {report}"
                ).format(hung=hung, seconds=f"{timeout:g}", why=why, report=report),
                report,
            )
    return [result.get() for result in results]
