"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): One cluster across the lab's PCs from the hosts file: ``./kit lab start | status | stop``.

``start`` runs the controller on this PC (the instructor's), listening on the lab network, and
the engines on every PC through ipyparallel's SSH engine launcher (Linux PCs, and Windows PCs
with OpenSSH server since ipyparallel 9); it returns once every engine answers and leaves them
running. Students connect with the ``start_cluster`` call they use on a laptop, pointed at the
profile (``COURSE_CLUSTER_PROFILE=lab``) or its ``ipcontroller-client.json``. ``status`` shows
what runs where, and names the PCs that dropped out (see :mod:`course_kit.lab.roster`);
``add HOSTS PC...`` starts a dropped-out PC's engines again, joined to the running controller
(the others and the students' clients are left alone); ``stop`` stops the engines on every PC
and the controller.

``start`` first asks every PC over SSH whether it is ready (:mod:`course_kit.lab.preflight`)
and starts nothing while one is not; a start that fails later stops what it started (engines,
controller, seat service) and removes the connection files, so the next start begins clean.
``status`` and ``stop`` also find a controller of the profile that no cluster file names any
more (left by a crashed start). Beside the controller runs the seat service that deals the
room's engines out to the students' notebooks (:mod:`course_kit.lab.seats`).

Kept whole: one life cycle (start, add, status, stop) over one profile's files and teardown.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from course_kit.lab.hosts import LabHosts, LabPC
from course_kit.lab.launcher import PCEngineSetLauncher
from course_kit.lab.mpi_engines import (
    MPI_ENGINES_FILE,
    mpi_engine_ids,
    start_mpi_engines,
    stop_mpi_engines,
)
from course_kit.lab.preflight import check_pcs, leftover_controllers
from course_kit.lab.roster import (
    HEARTBEAT_MISSES,
    HEARTBEAT_MS,
    ROSTER_FILE,
    read_roster,
    record_roster,
    roster_report,
)
from course_kit.lab.seats import seat_lines, start_seat_service, stop_seat_service
from course_lib.cluster.seat import SEATS_FILE

__all__ = ["LAB_CLUSTER_ID", "LabStartError", "add_pcs", "lab_status", "start_lab", "stop_lab"]

# ipcluster's own (empty) id: the files keep their usual names (ipcontroller-client.json, which
# students' start_cluster finds by profile), and status and stop find what start left running.
LAB_CLUSTER_ID = ""
WATCH_SECONDS = 10  # how long one remote wait of the launcher's engine watcher lasts
# What a start leaves in the profile's security folder; a failed start or a stop removes them.
LAB_FILES = ("ipcontroller-client.json", "ipcontroller-engine.json", f"cluster-{LAB_CLUSTER_ID}.json",
             ROSTER_FILE, SEATS_FILE, MPI_ENGINES_FILE)  # fmt: skip


class LabStartError(ValueError):
    """``lab start`` stopped before or after starting: the message says why (a line per PC)."""


def _profile_dir(profile: str) -> str:
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir

    return ProfileDir.find_profile_dir_by_name(get_ipython_dir(), profile).location


def _security(hosts: LabHosts) -> Path | None:
    """Return the profile's security folder, or None when the profile does not exist."""
    from IPython.core.profiledir import ProfileDirError

    try:
        return Path(_profile_dir(hosts.profile)) / "security"
    except ProfileDirError:
        return None


def _is_running(hosts: LabHosts) -> bool:
    """Return True when the controller that ``start`` left for this profile still runs."""
    import psutil

    security = _security(hosts)
    state = security / f"cluster-{LAB_CLUSTER_ID}.json" if security else None
    if state is None or not state.is_file():
        return False
    try:
        pid = json.loads(state.read_text())["controller"]["state"]["pid"]
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (ValueError, KeyError, TypeError, psutil.Error):
        return False


def _load(hosts: LabHosts) -> Any | None:
    """Return the lab cluster ``start`` left running (with its launchers), or None."""
    import ipyparallel as ipp
    from traitlets.config import Config

    security = _security(hosts)
    state = security / f"cluster-{LAB_CLUSTER_ID}.json" if security else None
    if state is None or not state.is_file():
        return None
    quiet = logging.getLogger("course_lib.lab")
    quiet.setLevel(logging.CRITICAL)
    # The engines' launcher keeps their pids per PC and starts no watcher (course_kit.lab.launcher).
    return ipp.Cluster.from_file(str(state), config=Config(), log=quiet)


def start_lab(hosts: LabHosts, timeout: float = 120.0, progress: Any = print) -> tuple[Any, float]:
    """Check every PC, start the controller here, the engines on every PC and the seat service.

    Returns the cluster and the seconds taken. Raises :class:`LabStartError` naming every PC that
    is not ready (nothing started then); on any later failure what was started is stopped and
    the connection files are removed. ``progress`` gets a line whenever more engines answer.
    """
    import ipyparallel as ipp

    if _is_running(hosts):
        raise ValueError(
            f"a lab cluster is already running in profile {hosts.profile!r}: "
            "see it with ./kit lab status HOSTS, or stop it with ./kit lab stop HOSTS"
        )
    if _leftovers(hosts):
        raise ValueError(
            f"a controller of profile {hosts.profile!r} is left from an earlier start "
            f"(pids {_leftovers(hosts)}): end it with ./kit lab stop HOSTS"
        )
    started = time.monotonic()
    if bad := check_pcs(hosts):
        raise LabStartError(
            f"{len(bad)} of {len(hosts.pcs)} PCs are not ready; nothing was "
            "started:\n" + "\n".join(f"  {line}" for line in bad)
        )
    progress(f"lab start: {len(hosts.pcs)} PCs ready over SSH ({time.monotonic() - started:.0f} s)")
    cluster = ipp.Cluster(
        profile=hosts.profile,
        cluster_id=LAB_CLUSTER_ID,
        controller_ip=hosts.controller_ip,
        engine_launcher_class=PCEngineSetLauncher,  # one SSH round trip per PC, PCs at once
        n=hosts.engines,
        shutdown_atexit=False,  # the lab outlives this command; ./kit lab stop ends it
        log_level=logging.CRITICAL,  # a failure is reported in one line below, not a traceback
    )
    # A dead PC is noticed by the controller's heartbeat: see lab.roster for the bound.
    cluster.controller_args = [
        f"--HeartMonitor.period={HEARTBEAT_MS}",
        f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
    ]
    _configure_launcher(cluster, hosts, hosts.pcs)
    cluster.config.PCEngineSetLauncher.progress = progress
    cluster.config.PCEngineSetLauncher.started_at = started  # its lines count from the start
    _remove_lab_files(hosts)  # stale files of an earlier run would mislead the students' clients
    try:
        with _stderr_to_devnull():  # the launcher's remote tracebacks: reported below in a line
            cluster.start_controller_sync()
            progress(
                f"lab start: controller listening on {hosts.controller_ip}; starting "
                f"{hosts.engines} engines on {len(hosts.pcs)} PCs at once "
                f"({time.monotonic() - started:.0f} s)"
            )
            cluster.start_engines_sync()
        with cluster.connect_client_sync() as client:
            _wait_with_progress(client, hosts.engines, timeout, started, progress)
            if hosts.mpi_ranks:
                start_mpi_engines(hosts, _security(hosts), client, timeout, progress)
            record_roster(_security(hosts), hosts, client, timeout=timeout)
        start_seat_service(_security(hosts), hosts.controller_ip, seat_size=hosts.seat)
    except BaseException as exc:
        _teardown(cluster, hosts)
        if isinstance(exc, Exception):
            raise LabStartError(
                f"starting failed, and what was started is stopped again: {_one_line(exc)}"
            ) from None
        raise
    finally:
        _stop_watchers(cluster)
    return cluster, time.monotonic() - started


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def _wait_with_progress(client: Any, n: int, timeout: float, started: float, progress: Any) -> None:
    """Wait until ``n`` engines registered, reporting each new count; TimeoutError past ``timeout``."""
    deadline, seen = time.monotonic() + timeout, -1
    while (count := len(client.ids)) < n:
        if count != seen:
            progress(
                f"lab start: {count} of {n} engines registered ({time.monotonic() - started:.0f} s)"
            )
            seen = count
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n - count} of {n} engines did not register within {timeout:g} s")
        time.sleep(0.5)
    progress(f"lab start: {n} of {n} engines registered ({time.monotonic() - started:.0f} s)")


def _leftovers(hosts: LabHosts) -> list[int]:
    """Return the pids of this profile's controllers that no cluster file names (a crashed start)."""
    security = _security(hosts)
    return leftover_controllers(str(security.parent)) if security else []


def _remove_lab_files(hosts: LabHosts) -> None:
    if (security := _security(hosts)) is not None:
        for name in LAB_FILES:
            (security / name).unlink(missing_ok=True)


def _teardown(cluster: Any, hosts: LabHosts) -> None:
    """Stop, each step on its own so one failure does not keep the next from running: the engines
    (over SSH; an unreachable PC fails, quietly), the controller, the seat service; remove files."""
    import psutil

    with _stderr_to_devnull():
        for engine_set_id in list(getattr(cluster, "engines", {})):
            with contextlib.suppress(Exception):
                cluster.stop_engines_sync(engine_set_id)
        with contextlib.suppress(Exception):
            cluster.stop_controller_sync()
    if (security := _security(hosts)) is not None:
        stop_seat_service(security)
        stop_mpi_engines(security)
    for pid in _leftovers(hosts):  # a controller the launcher could not stop
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
            psutil.Process(pid).wait(10)
    _remove_lab_files(hosts)


def _configure_launcher(
    cluster: Any, hosts: LabHosts, pcs: tuple[LabPC, ...], counts: dict[str, int] | None = None
) -> None:
    """Point the engine launcher at ``pcs``: engines (``counts`` per PC, else the hosts file's), Python, ssh."""
    launcher = cluster.config.PCEngineSetLauncher
    counts = counts if counts is not None else {pc.host: pc.engines for pc in pcs}
    launcher.engines = {
        pc.host: {
            "n": counts[pc.host],
            "remote_python": pc.python,
            "engine_cmd": [pc.python, "-m", "ipyparallel.engine"],
        }
        for pc in pcs
        if counts[pc.host]
    }
    launcher.ssh_cmd = list(hosts.ssh)


def _pcs_named(hosts: LabHosts, names: list[str]) -> tuple[LabPC, ...]:
    by_name = {pc.host: pc for pc in hosts.pcs}
    unknown = [name for name in names if name not in by_name]
    if not names:
        raise ValueError(
            f"name the PCs to re-add: ./kit lab add HOSTS PC... ({', '.join(by_name)})"
        )
    if unknown:
        raise ValueError(
            f"no PC {', '.join(map(repr, unknown))} in {hosts.path or 'the hosts file'}: "
            f"name PCs as its [[pc]] host entries list them ({', '.join(by_name)})"
        )
    return tuple(by_name[name] for name in dict.fromkeys(names))


def add_pcs(hosts: LabHosts, names: list[str], timeout: float = 120.0) -> tuple[list[str], float]:
    """Start again the missing engines of the PCs ``names`` that dropped out; return those PCs, seconds.

    PCs whose engines all answer are left alone; on a re-added PC the engines that still answer
    keep running (a student's seat on them is not disturbed) and only the missing ones start.
    What is left of its earlier engines that no longer answer (one that lost its link and is
    back, unregistered) is stopped first. Engines elsewhere and the students' clients are not
    touched; a student's client sees the new engines at once.
    """
    started = time.monotonic()
    pcs = _pcs_named(hosts, names)
    if not _is_running(hosts):
        raise ValueError(
            f"no lab cluster is running in profile {hosts.profile!r}: "
            "start one with ./kit lab start HOSTS"
        )
    security = _security(hosts)
    mpi_ids = mpi_engine_ids(security)
    with _client(hosts) as client:
        _, _, dropped = roster_report(hosts, security, client, mpi_ids=mpi_ids)
        todo = tuple(pc for pc in pcs if pc.host in dropped)
        if not todo:
            return [], time.monotonic() - started
        # roster_report waited for the heartbeat: what is registered now answers.
        roster, registered = read_roster(security), set(client.ids) - set(mpi_ids)
        alive = {
            pc.host: [e for e in registered if roster.get(e, {}).get("pc") == pc.host]
            for pc in todo
        }
        missing = {pc.host: max(0, pc.engines - len(alive[pc.host])) for pc in todo}
        cluster = _load(hosts)
        try:
            keep = {roster[e]["pid"] for ids in alive.values() for e in ids}
            _stop_engines_on(cluster, {pc.host for pc in todo}, keep=keep)
            before = len(client.ids)
            _configure_launcher(cluster, hosts, todo, counts=missing)
            cluster.start_engines_sync()
            client.wait_for_engines(before + sum(missing.values()), timeout=timeout)
            record_roster(security, hosts, client, timeout=timeout)
        finally:
            _stop_watchers(cluster)
    return [pc.host for pc in todo], time.monotonic() - started


def _stop_engines_on(cluster: Any, pcs: set[str], keep: set[int] = frozenset()) -> None:
    """Kill what the launcher started earlier on ``pcs``, except the pids ``keep`` (engines that answer)."""
    import signal

    with _stderr_to_devnull():  # a dead engine's `kill` prints a remote traceback: expected
        for engine_set in cluster.engines.values():
            for launcher in getattr(engine_set, "launchers", {}).values():
                if launcher.location in pcs and launcher.state == "running":
                    with contextlib.suppress(Exception):  # gone, or the PC is unreachable
                        launcher.signal(signal.SIGKILL, keep=keep)


@contextlib.contextmanager
def _stderr_to_devnull() -> Iterator[None]:
    """Send this process's stderr (fd 2, inherited by ssh) to /dev/null for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _client(hosts: LabHosts) -> Any:
    """Return a plain client of the running lab (as a student's): no launchers, no watchers."""
    import ipyparallel as ipp

    return ipp.Client(str(_security(hosts) / "ipcontroller-client.json"))


def _stop_watchers(cluster: Any) -> None:
    """End the launcher's per-engine watcher threads, so none outlives this command.

    A watcher left running would hold this command's output open (``./kit lab start | tee``
    would not end) and print a broken-pipe error on the PC once the command is gone.
    """
    launchers = [
        launcher
        for engine_set in cluster.engines.values()
        for launcher in getattr(engine_set, "launchers", {}).values()
    ]
    for launcher in launchers:
        if (stop := getattr(launcher, "_stop_waiting", None)) is not None:
            stop.set()
    for launcher in launchers:
        if (thread := getattr(launcher, "_wait_thread", None)) is not None:
            thread.join(timeout=WATCH_SECONDS + 30)


def lab_status(hosts: LabHosts) -> tuple[bool, str]:
    """Return (every engine answers, a table of the engines per PC naming those that dropped out)."""
    if not _is_running(hosts):
        if left := _leftovers(hosts):
            return False, (
                f"no lab cluster is running in profile {hosts.profile!r}, but a "
                f"controller an earlier start left is (pids {left}): end it with "
                "./kit lab stop HOSTS"
            )
        return False, f"no lab cluster is running in profile {hosts.profile!r}"
    with _client(hosts) as client:
        security = _security(hosts)
        ok, lines, dropped = roster_report(
            hosts, security, client, mpi_ids=mpi_engine_ids(security)
        )
        registered = len(client.ids)
    lines += seat_lines(_security(hosts))
    head = f"lab cluster {'OK' if ok else 'INCOMPLETE'}: {registered} of {hosts.engines + hosts.mpi_ranks} engines "
    head += f"registered at the controller (profile {hosts.profile!r})"
    if dropped:
        head += f"; dropped out: {', '.join(dropped)}"
    return ok, "\n".join([head, *lines])


def stop_lab(hosts: LabHosts, progress: Any = None) -> bool:
    """Stop the engines on every PC, the controller and the seat service; False: none was running.

    Also ends a controller of the profile that an earlier start left behind, and removes the
    connection files, so the next start begins clean. ``progress`` gets a line per step.
    """
    started = time.monotonic()
    say = progress or (lambda line: None)
    cluster = _load(hosts) if _is_running(hosts) else None
    leftover = _leftovers(hosts)
    if cluster is None and not leftover:
        _remove_lab_files(hosts)
        return False
    try:
        if cluster is not None:
            say(f"lab stop: stopping the engines on {len(hosts.pcs)} PCs at once")
            with _stderr_to_devnull():  # `kill` of an engine that died earlier prints a traceback
                with contextlib.suppress(Exception):  # what is left is ended by _teardown
                    cluster.stop_engines_sync()
            say(f"lab stop: engines stopped ({time.monotonic() - started:.0f} s)")
            with _stderr_to_devnull(), contextlib.suppress(Exception):
                cluster.stop_controller_sync()
            say(f"lab stop: controller stopped ({time.monotonic() - started:.0f} s)")
    finally:
        if cluster is not None:
            _stop_watchers(cluster)  # they end at once: the engines they watch are gone
        _teardown(cluster if cluster is not None else object(), hosts)
    return True
