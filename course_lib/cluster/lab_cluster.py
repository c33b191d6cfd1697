"""One cluster across the lab's PCs from the hosts file: ``./kit lab start | status | stop``.

``start`` runs the controller on this PC (the instructor's), listening on the lab network, and
the engines on every PC through ipyparallel's SSH engine launcher (Linux PCs, and Windows PCs
with OpenSSH server since ipyparallel 9); it returns once every engine answers and leaves them
running. Students connect with the ``start_cluster`` call they use on a laptop, pointed at the
profile (``COURSE_CLUSTER_PROFILE=lab``) or its ``ipcontroller-client.json``. ``status`` shows
what runs where; ``stop`` stops the engines on every PC and the controller.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from course_lib.cluster.lab_hosts import LabHosts

__all__ = ["LAB_CLUSTER_ID", "lab_status", "start_lab", "stop_lab"]

# ipcluster's own (empty) id: the files keep their usual names (ipcontroller-client.json, which
# students' start_cluster finds by profile), and status and stop find what start left running.
LAB_CLUSTER_ID = ""
WATCH_SECONDS = 10  # how long one remote wait of the launcher's engine watcher lasts


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

    security = _security(hosts)
    if security is None:
        return None
    quiet = logging.getLogger("course_lib.lab")
    quiet.setLevel(logging.CRITICAL)
    manager = ipp.ClusterManager(log=quiet)
    clusters = manager.load_clusters(profile_dirs=[str(security.parent)])
    return next((c for c in clusters.values() if c.cluster_id == LAB_CLUSTER_ID), None)


def start_lab(hosts: LabHosts, timeout: float = 120.0) -> tuple[Any, float]:
    """Start the controller here and the engines on every PC; return the cluster, seconds taken."""
    import ipyparallel as ipp

    if _is_running(hosts):
        raise ValueError(
            f"a lab cluster is already running in profile {hosts.profile!r}: "
            "see it with ./kit lab status HOSTS, or stop it with ./kit lab stop HOSTS"
        )
    started = time.monotonic()
    cluster = ipp.Cluster(
        profile=hosts.profile,
        cluster_id=LAB_CLUSTER_ID,
        controller_ip=hosts.controller_ip,
        engine_launcher_class="ssh",
        n=hosts.engines,
        shutdown_atexit=False,  # the lab outlives this command; ./kit lab stop ends it
    )
    launcher = cluster.config.SSHEngineSetLauncher
    # Per PC: its Python, and the engine command made from it (the launcher builds that command
    # once, from its own remote_python, and would not see a per-PC one).
    launcher.engines = {
        pc.host: {"n": pc.engines, "remote_python": pc.python,
                  "engine_cmd": [pc.python, "-m", "ipyparallel.engine"]}
        for pc in hosts.pcs if pc.engines
    }  # fmt: skip
    launcher.ssh_cmd = list(hosts.ssh)
    launcher.scp_cmd = list(hosts.scp)
    # The launcher watches each engine with `ssh PC python -c "wait for pid, N s"`; a short N
    # lets this command end those watchers soon after the engines answer (see below).
    launcher.poll_seconds = WATCH_SECONDS
    try:
        cluster.start_cluster_sync()
        with cluster.connect_client_sync() as client:
            client.wait_for_engines(hosts.engines, timeout=timeout)
    except BaseException:
        cluster.stop_cluster_sync()
        raise
    finally:
        _stop_watchers(cluster)
    return cluster, time.monotonic() - started


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


def lab_status(hosts: LabHosts, timeout: float = 30.0) -> tuple[bool, str]:
    """Return (every engine answers, a table of the engines on each PC)."""
    import ipyparallel as ipp

    from course_lib.cluster.engine_side import describe_engine

    if not _is_running(hosts):
        return False, f"no lab cluster is running in profile {hosts.profile!r}"
    # A plain client (as a student's): loading the cluster's launchers would start watchers.
    with ipp.Client(str(_security(hosts) / "ipcontroller-client.json")) as client:
        ids = list(client.ids)
        pending = {eid: client[eid].apply_async(describe_engine, False) for eid in ids}
        where: Counter[str] = Counter()
        lines = []
        for eid, result in pending.items():
            try:
                info = result.get(timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - a dead engine is a row of the table
                lines.append(f"  engine {eid}: not answering ({type(exc).__name__})")
                continue
            where[info["host"]] += 1
            lines.append(f"  engine {eid}: host {info['host']}, pid {info['pid']}")
    ok = len(ids) == hosts.engines == sum(where.values())
    head = [f"lab cluster {'OK' if ok else 'INCOMPLETE'}: {len(ids)} of {hosts.engines} "
            f"engines registered at the controller (profile {hosts.profile!r})"]  # fmt: skip
    head += [f"  {pc.host}: {pc.engines} engines wanted" for pc in hosts.pcs]
    head += [f"  host {host}: {n} engines answer" for host, n in sorted(where.items())]
    return ok, "\n".join(head + lines)


def stop_lab(hosts: LabHosts) -> bool:
    """Stop the engines on every PC and the controller; return False when none was running."""
    cluster = _load(hosts) if _is_running(hosts) else None
    if cluster is None:
        return False
    try:
        cluster.stop_cluster_sync()
    finally:
        _stop_watchers(cluster)  # they end at once: the engines they watch are gone
    return True
