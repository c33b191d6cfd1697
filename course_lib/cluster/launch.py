"""Get engines for a notebook: start local or MPI engines, or connect to the lab's running cluster.

One rule for every lecture: the notebook asks for what it needs (``start_cluster(n=4)``), and
the environment decides where the engines come from: local engines on this PC by default, the
room's cluster when ``COURSE_CLUSTER_PROFILE`` or ``COURSE_CLUSTER_FILE`` name one (the lab's
``./kit lab start``). In the room the notebook gets a *seat*, engines of its own that no other
notebook uses while it is open (:mod:`course_lib.cluster.seat`); with no free seat it says
so in one line and runs on local engines. Every cluster says which it got (``cluster.where()``,
printed when it starts)::

    with start_cluster(n=4) as cluster:      # local engines, or a seat of 4 in the room
        cluster.view.apply_sync(lambda: rank)

    cluster = start_cluster(kind="mpi", n=4)  # every engine an MPI rank (on this PC)
    cluster = connect_cluster(profile="lab")  # the whole room: the instructor's demo

An explicit ``kind="local"`` still means this PC, whatever the environment says.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipyparallel as ipp

from course_lib.cluster import engine_side
from course_lib.cluster.doctor import DoctorReport, doctor
from course_lib.cluster.recovery import EngineTimeout, RecoveryReport, recover, run_with_timeout
from course_lib.cluster.seat import NoSeatError, Seat, take_seat
from course_lib.cluster.stopping import stop_owned_cluster

__all__ = [
    "KINDS",
    "ClusterError",
    "ClusterSettings",
    "CourseCluster",
    "EngineTimeout",
    "connect_cluster",
    "default_engine_count",
    "find_mpiexec",
    "start_cluster",
]

KINDS = ("local", "mpi", "connect")
#: How long a listed engine may take to describe itself before it is left out as dead.
SILENT_ENGINE_SECONDS = 90.0


class ClusterError(RuntimeError):
    """A cluster could not be started or reached; the message says what to do."""


def default_engine_count() -> int:
    """Return a sensible engine count for this machine: its cores, at least 2, at most 4."""
    return max(2, min(os.cpu_count() or 2, 4))


def find_mpiexec() -> str | None:
    """Return the ``mpiexec`` beside this Python (a venv's own, even if not activated), or on PATH."""
    # A kernel started from a venv that is not activated has the venv's bin/ off PATH, so the
    # mpiexec that `pip install mpich` put there would be missed by a PATH lookup alone.
    for folder in (Path(sys.executable).parent, Path(sys.prefix) / "bin"):
        for name in ("mpiexec", "mpiexec.exe"):
            candidate = folder / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return shutil.which("mpiexec")


@dataclass(frozen=True)
class ClusterSettings:
    """Validated settings for :func:`start_cluster`; unset fields come from the environment."""

    kind: str = "local"
    n: int | None = None
    profile: str | None = None
    connection_file: str | None = None
    torch_threads: int | None = None
    seed: int | None = None
    seed_per_rank: bool = False
    timeout: float = 60.0
    #: connected engines that must be MPI ranks: the room's MPI world (asked as kind="mpi")
    mpi: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown cluster kind {self.kind!r}: choose one of {', '.join(KINDS)}"
            )
        if self.n is not None and (not isinstance(self.n, int) or self.n < 1):
            raise ValueError(f"n={self.n!r}: the number of engines must be an integer >= 1")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads={self.torch_threads}: use an integer >= 1, or None")
        if self.timeout <= 0:
            raise ValueError(f"timeout={self.timeout}: use a positive number of seconds")
        if self.kind == "connect" and not (self.profile or self.connection_file):
            raise ValueError(
                "kind='connect' needs profile='NAME' or connection_file='.../ipcontroller-client.json'"
            )

    @classmethod
    def from_environment(cls, **overrides: Any) -> ClusterSettings:
        """Build settings from arguments, falling back to ``COURSE_CLUSTER_*`` variables."""
        env = os.environ
        given = {key: value for key, value in overrides.items() if value is not None}
        profile = given.get("profile", env.get("COURSE_CLUSTER_PROFILE") or None)
        connection_file = given.get("connection_file", env.get("COURSE_CLUSTER_FILE") or None)
        kind = given.get("kind", env.get("COURSE_CLUSTER_KIND") or None)
        if kind is None:
            kind = "connect" if (profile or connection_file) else "local"
        elif kind == "mpi" and (profile or connection_file):
            # A notebook that needs MPI ranks, in the lab: the room's MPI world (one seat).
            kind, given["mpi"] = "connect", True
        if "n" not in given and env.get("COURSE_CLUSTER_ENGINES"):
            try:
                given["n"] = int(env["COURSE_CLUSTER_ENGINES"])
            except ValueError:
                raise ValueError(
                    f"COURSE_CLUSTER_ENGINES={env['COURSE_CLUSTER_ENGINES']!r} is not an integer"
                ) from None
        given.update(kind=kind, profile=profile, connection_file=connection_file)
        return cls(**given)


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
            what = "MPI engines (ranks)" if self.kind == "mpi" else "local engines"
            hint = ""
            if self.kind == "mpi" and (self.settings.profile or self.settings.connection_file):
                hint = " (the room has no MPI ranks free for this notebook)"
            return f"{self.world_size} {what} on this PC{hint}"
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
        return f"{held} {self.world_size} {what} of the room's cluster ({source}) on {on}{lost}"

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
        threads = _threads_per_engine(self.settings, self.world_size)
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
                f"course_lib: engines {dead} died (or did not answer within "
                f"{min(self.settings.timeout, SILENT_ENGINE_SECONDS):g} s) and are left out; "
                f"{len(infos)} remain"
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
                print(f"course_lib: stopping {self.world_size} {self.kind} engines ...", end="")
                started = time.monotonic()
                stop_owned_cluster(self.owned)  # every engine at once (cluster/stopping.py)
                self.owned = None
                print(f" stopped in {time.monotonic() - started:.1f} s", flush=True)

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


def start_cluster(
    kind: str | None = None,
    n: int | None = None,
    *,
    profile: str | None = None,
    connection_file: str | None = None,
    torch_threads: int | None = None,
    seed: int | None = None,
    seed_per_rank: bool = False,
    timeout: float = 60.0,
    activate: bool = False,
) -> CourseCluster:
    """Start local or MPI engines, or connect to a running cluster; return a :class:`CourseCluster`.

    Args:
        kind: ``"local"`` (default), ``"mpi"`` (every engine an MPI rank) or ``"connect"``;
            default from ``COURSE_CLUSTER_KIND``, or ``"connect"`` when a profile/file is given.
        n: number of engines (default: ``COURSE_CLUSTER_ENGINES`` or :func:`default_engine_count`);
            for ``"connect"``, the number of engines to wait for.
        torch_threads: threads per engine (default: cores // n, so engines do not thrash).
        seed: seed Python, NumPy and torch on every engine; ``seed_per_rank`` adds the rank.
        activate: register ``%px`` magics on the rank-ordered view.
    """
    settings = ClusterSettings.from_environment(
        kind=kind,
        n=n,
        profile=profile,
        connection_file=connection_file,
        torch_threads=torch_threads,
        seed=seed,
        seed_per_rank=seed_per_rank or None,
        timeout=timeout,
    )
    notebook = kind is None or settings.mpi  # a notebook's own request, not a named cluster
    if settings.kind == "connect":
        if notebook:
            _give_back_earlier_seat(settings.mpi)
        try:
            cluster = _connect(settings)
        except NoSeatError as exc:
            if kind == "connect" or settings.n is None:  # asked for the room itself: say so
                raise ClusterError(f"no seat in the room: {exc}") from None
            # A notebook asked for n engines; the room has none free: one line, then this PC.
            here = "mpi" if settings.mpi else "local"
            local = ClusterSettings(**{**settings.__dict__, "kind": here, "mpi": False})
            what = "MPI ranks" if settings.mpi else "local engines"
            print(
                f"course_lib: {exc}; running on {settings.n} {what} on this PC instead "
                "(start_cluster again later for a seat in the room)"
            )
            cluster = _start(local)
    else:
        cluster = _start(settings)
    try:
        cluster.setup_engines()
    except BaseException:
        cluster.stop()
        raise
    if activate:
        cluster.activate()
    print(f"course_lib: {cluster.where()}")
    if notebook and cluster.seat is not None:
        _NOTEBOOK_SEAT[settings.mpi] = weakref.ref(cluster)
    return cluster


# The seats this process's notebook holds (weak references, so a dropped cluster is not kept):
# one of engines and one of MPI ranks (lecture 0 holds both at once). Process-wide on purpose: a
# seat belongs to the kernel, and a notebook that runs its `cluster = start_cluster(n=4)` cell
# again must not hold two seats (the old one would only go once the new one exists, and in a
# full room the new one would find none).
_NOTEBOOK_SEAT: dict[bool, weakref.ref] = {}


def _give_back_earlier_seat(mpi: bool) -> None:
    """Stop the cluster of this notebook's earlier seat of the same sort, if still open."""
    ref = _NOTEBOOK_SEAT.pop(mpi, None)
    old = ref() if ref is not None else None
    if old is not None and old.seat is not None and not old.seat.released:
        print(f"course_lib: giving back this notebook's earlier seat (engines {old.ids_by_rank})")
        old.stop()


def connect_cluster(
    profile: str | None = None,
    connection_file: str | None = None,
    n: int | None = None,
    **kwargs: Any,
) -> CourseCluster:
    """Connect to a running cluster by profile name or connection file (the lab's way)."""
    return start_cluster("connect", n, profile=profile, connection_file=connection_file, **kwargs)


#: Heartbeat period (ms) of the controllers ``start_cluster`` starts itself (not the lab's).
LOCAL_HEARTBEAT_MS = 500


def _threads_per_engine(settings: ClusterSettings, n: int) -> int | None:
    """Threads for each of ``n`` engines: as asked, else cores // n; a lab cluster keeps its own."""
    if settings.torch_threads is not None or settings.kind == "connect":
        return settings.torch_threads
    return max(1, (os.cpu_count() or 1) // max(1, n))


def _start(settings: ClusterSettings) -> CourseCluster:
    n = settings.n or default_engine_count()
    settings = ClusterSettings(**{**settings.__dict__, "n": n})
    launcher = "local"
    mpi_cmd = None
    if settings.kind == "mpi":
        mpi_cmd = find_mpiexec()
        if mpi_cmd is None:
            raise ClusterError(
                "mpiexec was not found beside this Python or on PATH: install an MPI "
                "(`pip install mpich` on Linux/macOS, the kit's [mpi] extra; MS-MPI on Windows), "
                "or use kind='local'"
            )
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise ClusterError(
                "mpi4py is missing: `pip install mpi4py`, or use kind='local'"
            ) from None
        launcher = "mpi"
    owned = ipp.Cluster(
        n=n,
        engines=launcher,
        log_level=40,
        engine_timeout=int(settings.timeout),
        controller_args=[
            # The controller registers an engine at its first heartbeat; at ipyparallel's 3 s
            # period, 4 engines took 5.7 s to register, at 0.5 s 1.1 s. The misses allowed keep
            # a silent engine's grace at the default 30 s, so a busy machine loses none.
            f"--HeartMonitor.period={LOCAL_HEARTBEAT_MS}",
            f"--HeartMonitor.max_heartmonitor_misses={30_000 // LOCAL_HEARTBEAT_MS}",
        ],
    )
    if mpi_cmd is not None:
        owned.config.MPILauncher.mpi_cmd = [mpi_cmd]
    # Threads are limited before the engines import torch / NumPy, as well as afterwards.
    threads = _threads_per_engine(settings, n)
    owned.config.EngineLauncher.environment = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
    }
    try:
        client = owned.start_and_connect_sync(n=n)
    except BaseException as exc:
        output = _engine_output(owned)
        _stop_quietly(owned)
        raise ClusterError(
            f"{n} {settings.kind} engines did not start within {settings.timeout:.0f} s "
            f"({type(exc).__name__}: {exc}).{output}"
        ) from exc
    return CourseCluster(settings, client, owned)


def _connect(settings: ClusterSettings) -> CourseCluster:
    try:
        if settings.connection_file:
            path = Path(settings.connection_file).expanduser()
            if not path.is_file():
                raise ClusterError(
                    f"connection file {str(path)!r} does not exist: ask the instructor for the "
                    "ipcontroller-client.json of the running cluster"
                )
            # ipp.Client(url_file=...) is ignored in ipyparallel 9.2: pass the file positionally.
            client = ipp.Client(str(path), timeout=settings.timeout)
        else:
            client = ipp.Client(profile=settings.profile, timeout=settings.timeout)
    except ClusterError:
        raise
    except (OSError, ipp.error.TimeoutError, TimeoutError) as exc:
        where = f"profile {settings.profile!r}" if settings.profile else settings.connection_file
        raise ClusterError(
            f"no running cluster for {where}: start one with "
            f"`ipcluster start -n 4 --profile={settings.profile or 'NAME'} --daemonize` "
            f"(or ask the instructor), then connect again ({type(exc).__name__}: {exc})"
        ) from exc
    n = settings.n or 1
    try:
        client.wait_for_engines(n, timeout=settings.timeout, interactive=False)
        # The lab's seat service (if the cluster has one) deals out engines of our own.
        seat = take_seat(
            _client_file(client, settings), settings.n, list(client.ids), mpi=settings.mpi
        )
    except NoSeatError:
        client.close()
        raise
    except (ipp.error.TimeoutError, TimeoutError) as exc:
        found = len(client.ids)
        client.close()
        raise ClusterError(
            f"the cluster's controller answered but only {found} of {n} engines registered "
            f"within {settings.timeout:.0f} s: start engines (`ipcluster engines -n {n} "
            f"--profile={settings.profile or 'NAME'}`) or ask for fewer"
        ) from exc
    cluster = CourseCluster(settings, client, owned=None)
    cluster.seat = seat
    if seat is not None:
        # A notebook that runs its start_cluster cell again drops the old cluster without
        # stop(): its seat goes back to the room when the old object goes.
        weakref.finalize(cluster, seat.release)
    return cluster


def _client_file(client: ipp.Client, settings: ClusterSettings) -> Path:
    """Return the ipcontroller-client.json this client was made from (its folder: the seats)."""
    if settings.connection_file:
        return Path(settings.connection_file).expanduser()
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir

    location = ProfileDir.find_profile_dir_by_name(get_ipython_dir(), settings.profile).location
    return Path(location) / "security" / "ipcontroller-client.json"


def _engine_output(owned: ipp.Cluster) -> str:
    texts = []
    for engine_set in list(owned.engines.values()):
        try:
            texts.append(engine_set.get_output() or "")
        except Exception:  # noqa: BLE001 - best effort, we are already reporting an error
            pass
    text = "\n".join(t for t in texts if t).strip()
    return f"\nEngine output:\n{text[-2000:]}" if text else ""


def _stop_quietly(owned: ipp.Cluster) -> None:
    try:
        owned.stop_cluster_sync()
    except Exception:  # noqa: BLE001 - cleanup after a failure must not hide the failure
        pass
