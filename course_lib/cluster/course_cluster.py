"""Lecture 0: the cluster a notebook holds: a client, a rank-ordered view, the engines behind it.

:class:`CourseCluster` is what :func:`course_lib.cluster.launch.start_cluster` returns: it orders
the engines by rank and gives each ``rank`` and ``world_size``, says which cluster it is
(``where()``), runs a function on every rank with a time limit, recovers hung engines, and stops
what it started (a context manager). How the engines are started or found is
:mod:`course_lib.cluster.launch`'s business.
"""

from __future__ import annotations

import time
from typing import Any

import ipyparallel as ipp

from course_lib.cluster import engine_side
from course_lib.cluster.doctor import DoctorReport, doctor
from course_lib.cluster.recovery import RecoveryReport, recover, run_with_timeout
from course_lib.cluster.seat import Seat
from course_lib.cluster.settings import ClusterError, ClusterSettings, threads_per_engine
from course_lib.cluster.stopping import stop_owned_cluster
from course_lib.i18n import _

__all__ = ["SILENT_ENGINE_SECONDS", "CourseCluster"]

#: How long a listed engine may take to describe itself before it is left out as dead.
SILENT_ENGINE_SECONDS = 90.0


class CourseCluster:
    """A client, a rank-ordered view and (when we started them) the engines behind it.

    Use it as a context manager: on exit it stops what it started and only closes the client
    of a cluster it merely connected to.
    """

    def __init__(self, settings: ClusterSettings, client: ipp.Client, owned: ipp.Cluster | None):
        self.settings = settings
        self.client = client
        self.owned = owned
        self.world_size = 0
        self.ids_by_rank: list[int] = []
        self.engine_info: dict[int, dict[str, Any]] = {}
        #: engines the controller still listed when this cluster was set up, found dead and left out
        self.left_out: list[int] = []
        #: the engines this client holds in the room (None: not a seated cluster)
        self.seat: Seat | None = None
        self._activated = False
        self._view: ipp.DirectView | None = None

    # -- properties -------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """Return ``"local"``, ``"mpi"`` or ``"connect"``."""
        return self.settings.kind

    @property
    def view(self) -> ipp.DirectView:
        """Return a blocking DirectView over all engines, ordered by rank."""
        if self._view is None:
            self._view = self.client[self.ids_by_rank]
            self._view.block = True
        return self._view

    def __repr__(self) -> str:
        return (
            f"<CourseCluster kind={self.kind} world_size={self.world_size} ids={self.ids_by_rank}"
            f": {self.where()}>"
        )

    def where(self) -> str:
        """Return one line saying which cluster this is: local, or the room's, on which PCs."""
        if self.kind != "connect":
            hint = ""
            if self.kind == "mpi" and (self.settings.profile or self.settings.connection_file):
                hint = _(" (the room has no MPI ranks free for this notebook)")
            if self.kind == "mpi":
                return _("{n} MPI engines (ranks) on this PC").format(n=self.world_size) + hint
            return _("{n} local engines on this PC").format(n=self.world_size) + hint
        hosts: dict[str, int] = {}
        for eid in self.ids_by_rank:
            host = self.seat.pcs.get(eid) if self.seat else None
            host = host or self.engine_info.get(eid, {}).get("host", "?")
            hosts[host] = hosts.get(host, 0) + 1
        on = ", ".join(f"{host} ({k})" for host, k in hosts.items())
        source = (
            f"profile {self.settings.profile!r}"
            if self.settings.profile
            else f"file {self.settings.connection_file}"
        )
        held = "a seat of" if self.seat else "all"
        what = "MPI ranks" if self.settings.mpi else "engines"
        lost = (
            " (SEAT LOST: the lab stopped, or no heartbeat reached it; start_cluster again)"
            if self.seat and self.seat.lost
            else ""
        )
        sized = (
            f"; the room's seats are {self.world_size} {what} (this notebook asked for "
            f"{self.seat.asked}): it runs on {self.world_size}"
            if self.seat and self.seat.asked
            else ""
        )
        return (
            f"{held} {self.world_size} {what} of the room's cluster ({source}) on {on}{lost}{sized}"
        )

    # -- life cycle ---------------------------------------------------------------------------
    def setup_engines(self) -> None:
        """Order engines by rank and give each ``rank``, ``world_size``, threads and seed."""
        infos = self._describe_all()
        mpi_ranks = {eid: info["mpi_rank"] for eid, info in infos.items()}
        if all(r is not None for r in mpi_ranks.values()) and len(set(mpi_ranks.values())) == len(
            mpi_ranks
        ):
            ordered = sorted(infos, key=lambda eid: mpi_ranks[eid])
        elif self.settings.mpi:
            raise ClusterError(
                "MPI ranks were asked for, but the cluster's engines are not the ranks of one "
                "MPI world: the instructor adds [mpi] ranks = N to the lab's hosts file"
            )
        else:
            ordered = sorted(infos)
        self.ids_by_rank, self.world_size, self.engine_info = ordered, len(ordered), infos
        self._view = None
        threads = threads_per_engine(self.settings, self.world_size)
        pending = [
            self.client[eid].apply_async(
                engine_side.setup_engine,
                rank,
                self.world_size,
                self.kind,
                threads,
                self.settings.seed,
                self.settings.seed_per_rank,
            )
            for rank, eid in enumerate(ordered)
        ]
        for result in pending:
            result.get(timeout=self.settings.timeout)
        if self._activated:
            self.view.activate()

    def _describe_all(self) -> dict[int, dict[str, Any]]:
        """Describe every registered engine; skip (and say so) engines that died but are still
        listed: the controller drops a dead engine only after a few missed heartbeats."""
        pending, dead = {}, []
        for eid in self.seat.ids if self.seat else self.client.ids:
            try:
                pending[eid] = self.client[eid].apply_async(engine_side.describe_engine, False)
            except IndexError:  # unregistered between reading ids and addressing it
                dead.append(eid)
        infos = {}
        # A listed engine that never answers is left out too: the controller usually fails its
        # request at once or after missed heartbeats, but not always soon (seen: not within
        # 300 s on a loaded machine), and an idle engine answers a description in milliseconds.
        deadline = time.monotonic() + min(self.settings.timeout, SILENT_ENGINE_SECONDS)
        for eid, result in pending.items():
            try:
                infos[eid] = result.get(timeout=max(0.1, deadline - time.monotonic()))
            except (ipp.error.EngineError, ipp.error.RemoteError) as exc:
                if "died" not in str(exc) and not isinstance(exc, ipp.error.EngineError):
                    raise
                dead.append(eid)
            except TimeoutError:
                dead.append(eid)
        self.left_out = dead
        if dead:
            print(
                _(
                    "course_lib: engines {dead} died (or did not answer within {seconds} s) "
                    "and are left out; {left} remain"
                ).format(
                    dead=dead,
                    seconds=f"{min(self.settings.timeout, SILENT_ENGINE_SECONDS):g}",
                    left=len(infos),
                )
            )
        if not infos:
            raise ClusterError(
                f"every engine ({dead}) has died: restart them (`ipcluster engines ...` in the "
                "lab, or start_cluster(...) again) and connect again"
            )
        return infos

    def activate(self) -> CourseCluster:
        """Register ``%px`` / ``%%px`` in IPython on the rank-ordered view; return self."""
        self._activated = True
        self.view.activate()
        return self

    def stop(self) -> None:
        """Close the client and stop the engines and controller if this object started them."""
        try:
            if self.seat is not None:
                self.seat.release()  # the engines go back to the room
            self.client.close()
        finally:
            if self.owned is not None:
                # Stopping takes seconds (each engine is asked, then signalled): say so first.
                print(
                    _("course_lib: stopping {n} {kind} engines ...").format(
                        n=self.world_size, kind=self.kind
                    ),
                    end="",
                )
                started = time.monotonic()
                stop_owned_cluster(self.owned)  # every engine at once (cluster/stopping.py)
                self.owned = None
                took = f"{time.monotonic() - started:.1f}"
                print(_(" stopped in {seconds} s").format(seconds=took), flush=True)

    def __enter__(self) -> CourseCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- teaching helpers ---------------------------------------------------------------------
    def run(self, fn: Any, *args: Any, timeout: float = 30.0, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every engine; return results ordered by rank.

        If an engine has not answered after ``timeout`` seconds, the cluster is recovered (see
        :meth:`recover`) and :class:`EngineTimeout` is raised saying which ranks hung and what
        was done; the client stays usable.
        """
        return run_with_timeout(self, fn, args, kwargs, timeout)

    def recover(self, grace: float = 3.0) -> RecoveryReport:
        """Interrupt busy engines and, if that does not free them, restart them all."""
        return recover(self, grace=grace)

    def doctor(self, timeout: float = 5.0) -> DoctorReport:
        """Return a table of every engine with version mismatches and unreachable engines flagged."""
        return doctor(self.client, timeout=timeout, expected=self.world_size or None)

    def wait_for_fresh_engines(self, old_pids: set[int], deadline: float) -> None:
        """Wait until ``world_size`` engines answer and none is one of ``old_pids``."""
        n = self.world_size
        while time.monotonic() < deadline:
            ids = list(self.client.ids)
            if len(ids) == n:
                try:  # an old engine may unregister between reading ids and addressing it
                    pending = [self.client[eid].apply_async(engine_side.engine_pid) for eid in ids]
                    pids = {result.get(timeout=2.0) for result in pending}
                except Exception:  # noqa: BLE001 - a dying or stale engine just means "not yet"
                    pids = set()
                if len(pids) == n and not pids & old_pids:
                    return
            time.sleep(0.25)
        raise ClusterError(
            f"engines did not come back within the time limit ({len(self.client.ids)} of {n} "
            "registered); stop this cluster (cluster.stop()) and start a new one"
        )
