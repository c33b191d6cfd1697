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

An explicit ``kind="local"`` still means this PC, whatever the environment says. The settings
and errors are :mod:`course_lib.cluster.settings`; the cluster returned is
:mod:`course_lib.cluster.course_cluster`'s :class:`CourseCluster` (both importable from
:mod:`course_lib.cluster`).
"""

from __future__ import annotations

import os
import shutil
import sys
import weakref
from pathlib import Path
from typing import Any

import ipyparallel as ipp

from course_lib.cluster.course_cluster import CourseCluster
from course_lib.cluster.engine_death import (
    engine_sets_output,
    how_engine_sets_ended,
    show_deaths_in_one_line,
)
from course_lib.cluster.mpi_here import mpiexec_here
from course_lib.cluster.seat import NoSeatError, take_seat
from course_lib.cluster.settings import (
    ClusterError,
    ClusterSettings,
    default_engine_count,
    threads_per_engine,
)
from course_lib.i18n import _, language

__all__ = ["connect_cluster", "find_mpiexec", "start_cluster"]


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
    if language() != "en":  # engines started here speak the notebook's language (checks' reasons)
        os.environ["COURSE_LANG"] = language()
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
            what = _("{n} MPI ranks") if settings.mpi else _("{n} local engines")
            line = _("course_lib: {reason}; running on {what} on this PC instead (start_cluster "
                     "again later for a seat in the room)")  # fmt: skip
            print(line.format(reason=exc, what=what.format(n=settings.n)))
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
    show_deaths_in_one_line(cluster)  # in a notebook: a dead engine is one line, not a screen
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
        print(
            _("course_lib: giving back this notebook's earlier seat (engines {ids})").format(
                ids=old.ids_by_rank
            )
        )
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
        owned.config.MPILauncher.mpi_cmd = mpiexec_here(mpi_cmd)  # this PC's, also in a Slurm job
    # Threads are limited before the engines import torch / NumPy, as well as afterwards.
    threads = threads_per_engine(settings, n)
    owned.config.EngineLauncher.environment = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
    }
    try:
        client = owned.start_and_connect_sync(n=n)
    except BaseException as exc:
        output, ended = engine_sets_output(owned), how_engine_sets_ended(owned, settings.kind)
        _stop_quietly(owned)
        if ended is not None:  # they died (mpiexec on a signal): not a matter of waiting longer
            raise ClusterError(
                f"{n} {settings.kind} engines ended while starting: {ended}.{output}"
            ) from exc
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
            if not _profile_client_file(settings.profile).is_file():  # no controller: say so now
                raise OSError("no controller has written its connection file")
            client = ipp.Client(profile=settings.profile, timeout=settings.timeout)
    except ClusterError:
        raise
    except (OSError, ipp.error.TimeoutError, TimeoutError) as exc:
        where = f"profile {settings.profile!r}" if settings.profile else settings.connection_file
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ClusterError(
            f"no running cluster for {where} ({why}): start the lab's cluster "
            f"(./kit lab start HOSTS.toml) or one of your own (ipcluster start -n 4 "
            f"--profile={settings.profile or 'NAME'} --daemonize), or ask the instructor"
        ) from None
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
    return _profile_client_file(settings.profile)


def _profile_client_file(profile: str) -> Path:
    """Return where a profile's running controller keeps ipcontroller-client.json."""
    from IPython.paths import get_ipython_dir

    return Path(get_ipython_dir()) / f"profile_{profile}" / "security" / "ipcontroller-client.json"


def _stop_quietly(owned: ipp.Cluster) -> None:
    try:
        owned.stop_cluster_sync()
    except Exception:  # noqa: BLE001 - cleanup after a failure must not hide the failure
        pass
