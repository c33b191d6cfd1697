"""The instructor's lab on the university's cluster (docs/instructor.md, "The university's cluster"; lecture 0 connects to it): engines and MPI ranks through Slurm, ``./kit lab start | status | stop | mpi SLURM.toml``.

A lab file with a ``[slurm]`` table instead of ``[[pc]]`` tables::

    [controller]
    ip = "10.1.2.3"            # the address the compute nodes reach this (login) node at
    profile = "slurm"

    [slurm]
    partition = "debug"
    nodes = 3
    tasks_per_node = 2         # engines per node
    time = "01:00:00"          # the job's time limit
    account = ""               # if the cluster bills an account
    python = "/home/me/course/.venv/bin/python"   # the same venv on every node
    conf = ""                  # SLURM_CONF, where it is not the cluster's default
    pending_limit = 600        # seconds a start waits in the queue before it gives up

``start`` runs the controller here and submits the engines as one job with ipyparallel's own
Slurm launcher (``sbatch``, ``srun`` inside); while the job waits it prints the queue's state and
Slurm's reason ("PENDING (Resources)"), and past ``pending_limit`` it cancels the job and says
so. Students connect exactly as to a room's cluster (the seat service runs here too). ``status``
names the job's state, its nodes and, for a job that ended or a node that went down, Slurm's
reason, in one line each; ``stop`` cancels the job. ``mpi`` runs a command as MPI ranks in an
allocation of its own (``salloc`` around MPICH's ``mpiexec``, which starts its proxies by ``srun``,
given the allocation's hosts by ``course_kit.lab.slurm_hosts``).

Kept whole: one Slurm job's life cycle (submit, wait, status, cancel) over one lab file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_kit.lab.mpi import MPI_ENV

__all__ = [
    "MPI_JOB_NAME",
    "SlurmLab",
    "is_slurm_lab",
    "read_slurm_lab",
    "slurm_job_state",
    "run_slurm_mpi",
    "slurm_mpi_command",
    "slurm_mpi_env",
    "slurm_status",
    "start_slurm_lab",
    "stop_slurm_lab",
]

JOB_FILE = "lab-slurm.json"
_KNOWN = {
    "controller": {"ip", "profile"},
    "slurm": {"partition", "nodes", "tasks_per_node", "time", "account", "python", "conf",
              "pending_limit"},
}  # fmt: skip


@dataclass(frozen=True)
class SlurmLab:
    """A lab file that asks Slurm for the engines: where, how many, for how long."""

    nodes: int
    tasks_per_node: int
    python: str
    partition: str = ""
    time: str = "01:00:00"
    account: str = ""
    conf: str = ""
    pending_limit: float = 600.0
    controller_ip: str = "*"
    profile: str = "slurm"
    path: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 4096:
            raise ValueError(f"[slurm] nodes = {self.nodes}: give 1 or more nodes")
        if not 1 <= self.tasks_per_node <= 256:
            raise ValueError(f"[slurm] tasks_per_node = {self.tasks_per_node}: give 1..256")
        if not self.python:
            raise ValueError("[slurm] python: give the venv's python, the same path on every node")
        if self.pending_limit <= 0:
            raise ValueError(f"[slurm] pending_limit = {self.pending_limit}: give seconds > 0")

    @property
    def engines(self) -> int:
        """Return the engines the job runs (nodes x tasks per node)."""
        return self.nodes * self.tasks_per_node

    def env(self) -> dict[str, str]:
        """Return what Slurm's commands need beyond this shell's environment."""
        return {"SLURM_CONF": self.conf} if self.conf else {}


def _toml_of(path: Path) -> dict[str, Any]:
    import tomllib

    if not path.is_file():
        raise ValueError(f"{path} does not exist: write the lab file (docs/instructor.md)")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML ({exc}): fix that line") from None


def is_slurm_lab(path: str | Path) -> bool:
    """Return True when the lab file asks Slurm for the engines (it has a ``[slurm]`` table)."""
    path = Path(path)
    return path.is_file() and "slurm" in _toml_of(path)


def read_slurm_lab(path: str | Path) -> SlurmLab:
    """Read and check a Slurm lab file; a mistake raises ValueError that names the fix."""
    path = Path(path)
    data = _toml_of(path)
    if unknown := sorted(set(data) - set(_KNOWN)):
        raise ValueError(f"{path}: unknown table(s) {', '.join(unknown)}; use {sorted(_KNOWN)}")
    for name, table in data.items():
        if bad := sorted(set(table) - _KNOWN[name]):
            raise ValueError(
                f"{path}: unknown key(s) {', '.join(bad)} in [{name}]; "
                f"known: {', '.join(sorted(_KNOWN[name]))}"
            )
    slurm, controller = data["slurm"], data.get("controller", {})
    return SlurmLab(
        nodes=int(slurm.get("nodes", 1)),
        tasks_per_node=int(slurm.get("tasks_per_node", 1)),
        python=str(slurm.get("python", "")),
        partition=str(slurm.get("partition", "")),
        time=str(slurm.get("time", "01:00:00")),
        account=str(slurm.get("account", "")),
        conf=str(slurm.get("conf", "")),
        pending_limit=float(slurm.get("pending_limit", 600)),
        controller_ip=str(controller.get("ip", "*")),
        profile=str(controller.get("profile", "slurm")),
        path=path,
    )


@contextlib.contextmanager
def _slurm_environment(lab: SlurmLab) -> Iterator[None]:
    """Give this process the lab's Slurm environment (ipyparallel's ``scancel`` reads it)."""
    saved = {key: os.environ.get(key) for key in lab.env()}
    os.environ.update(lab.env())
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def slurm_job_state(job: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Return Slurm's record of ``job`` (JobState, Reason, NodeList, ...); empty when forgotten."""
    done = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job)],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=30,
    )
    record = {}
    for word in done.stdout.split():
        key, _, value = word.partition("=")
        record.setdefault(key, value)
    return record if done.returncode == 0 else {}


def _down_nodes(nodes: str, env: dict[str, str]) -> list[str]:
    """Return one phrase per node of ``nodes`` that Slurm holds DOWN or DRAINED, with its reason."""
    if not nodes or nodes == "(null)":
        return []
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-n", nodes, "-o", "%N|%T|%E"],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    phrases = []
    for line in done.stdout.splitlines():
        name, state, reason = (line.split("|") + ["", ""])[:3]
        if state.startswith(("down", "drain", "fail")):
            phrases.append(f"node {name} is {state.upper()} (Slurm's reason: {reason or 'none'})")
    return phrases


def _job_line(job: str, record: dict[str, str], env: dict[str, str]) -> tuple[bool, str]:
    """Return (the job runs, one line about it naming its state, nodes and Slurm's reason)."""
    if not record:
        return False, f"Slurm job {job} is gone (Slurm no longer lists it): start the lab again"
    state, reason = record.get("JobState", "?"), record.get("Reason", "None")
    nodes = record.get("NodeList", "")
    down = _down_nodes(nodes, env)
    why = f" (Slurm's reason: {reason})" if reason not in ("None", "") else ""
    if state == "RUNNING" and not down:
        return True, f"Slurm job {job} RUNNING on {nodes} (time limit {record.get('TimeLimit')})"
    text = f"Slurm job {job} {state}{why} on {nodes or 'no node'}"
    if down:
        text += "; " + "; ".join(down)
    return False, text + ": its engines are gone; ./kit lab stop FILE, then start again"


def _record_places(security: Path, client: Any, timeout: float) -> None:
    """Write the roster: every engine's node (from the engine itself), as ``lab start`` does."""
    from course_kit.lab.roster import ROSTER_FILE, engine_place
    from course_lib.files import atomic_write_text

    places = {eid: client[eid].apply_async(engine_place) for eid in client.ids}
    roster = {}
    for eid, result in places.items():
        place = result.get(timeout=timeout)
        roster[eid] = {"pc": place["host"], "host": place["host"], "pid": place["pid"]}
    atomic_write_text(security / ROSTER_FILE, json.dumps(roster, indent=1, sort_keys=True))


def start_slurm_lab(
    lab: SlurmLab,
    timeout: float = 600.0,
    progress: Callable[[str], Any] = print,
) -> tuple[Any, float]:
    """Start the controller here and the engines as one Slurm job; return the cluster, seconds.

    ``timeout`` bounds the wait once the job runs; ``lab.pending_limit`` the wait in the queue.
    Any failure cancels the job, stops the controller and raises ``LabStartError`` in one line.
    """
    import ipyparallel as ipp

    from course_kit.lab.cluster import (
        LAB_CLUSTER_ID,
        LabStartError,
        _is_running,
        _leftovers,
        _remove_lab_files,
        _security,
        _stop_watchers,
        _teardown,
    )
    from course_kit.lab.roster import HEARTBEAT_MISSES, HEARTBEAT_MS
    from course_kit.lab.seats import start_seat_service

    if _is_running(lab) or _leftovers(lab):  # type: ignore[arg-type]
        raise ValueError(
            f"a lab cluster of profile {lab.profile!r} is running or left over: "
            "see ./kit lab status FILE, or end it with ./kit lab stop FILE"
        )
    started = time.monotonic()
    cluster = ipp.Cluster(
        profile=lab.profile,
        cluster_id=LAB_CLUSTER_ID,
        controller_ip=lab.controller_ip,
        engine_launcher_class="slurm",
        n=lab.engines,
        shutdown_atexit=False,
        log_level=50,
    )
    # The lab's heartbeat (course_kit.lab.roster): a cancelled job's engines are unregistered
    # within 12 s, so a seated notebook hears of it then, not after ipyparallel's 30 s.
    cluster.controller_args = [
        f"--HeartMonitor.period={HEARTBEAT_MS}",
        f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}",
    ]
    security = _security(lab)  # type: ignore[arg-type]
    launcher = cluster.config.SlurmEngineSetLauncher
    launcher.engine_cmd = [lab.python, "-m", "ipyparallel.engine"]
    # The job script beside the job's output, not in the caller's working folder.
    launcher.batch_file_name = str(Path(cluster.profile_dir) / "log" / "kit-lab-engines.sbatch")
    launcher.environment = dict(lab.env())
    extra = f"#SBATCH --partition={lab.partition}\n" if lab.partition else ""
    extra += f"#SBATCH --account={lab.account}\n" if lab.account else ""
    launcher.batch_template = (
        # --no-requeue: a job whose node fails ends (NODE_FAIL), and status says so, instead of
        # waiting in the queue again while the students' engines are gone.
        "#!/bin/sh\n#SBATCH --export=ALL\n#SBATCH --job-name=kit-lab-engines\n#SBATCH --no-requeue\n"
        f"#SBATCH --nodes={lab.nodes}\n#SBATCH --ntasks-per-node={lab.tasks_per_node}\n"
        f"#SBATCH --ntasks={{n}}\n#SBATCH --time={lab.time}\n{extra}"
        "#SBATCH --output={profile_dir}/log/slurm-engines-%j.out\n"  # not the caller's folder
        "srun {program_and_args}\n"
    )
    _remove_lab_files(lab)  # type: ignore[arg-type]
    try:
        with _slurm_environment(lab):
            cluster.start_cluster_sync()
            security = Path(cluster.profile_dir) / "security"
            job = next(iter(cluster.engines.values())).job_id
            (security / JOB_FILE).write_text(json.dumps({"job": job, "lab": str(lab.path)}))
            with cluster.connect_client_sync() as client:
                _wait_for_job(lab, job, client, timeout, started, progress)
                _record_places(security, client, timeout)
            start_seat_service(security, lab.controller_ip, slurm_job=str(job))
    except BaseException as exc:
        with _slurm_environment(lab):
            _teardown(cluster, lab)  # type: ignore[arg-type]
        if security is not None:
            (security / JOB_FILE).unlink(missing_ok=True)
        if isinstance(exc, Exception):
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise LabStartError(f"{text[:400]}; the job is cancelled, nothing left") from None
        raise
    finally:
        _stop_watchers(cluster)
    return cluster, time.monotonic() - started


def _wait_for_job(
    lab: SlurmLab, job: str, client: Any, timeout: float, started: float, progress: Callable
) -> None:
    """Wait for every engine, saying the queue's state whenever it or the count changes."""
    said, queued_until = "", None
    while (count := len(client.ids)) < lab.engines:
        record = slurm_job_state(job, lab.env())
        state, reason = record.get("JobState", "GONE"), record.get("Reason", "None")
        waited = time.monotonic() - started
        line = f"Slurm job {job} {state}" + (f" ({reason})" if reason != "None" else "")
        if line + str(count) != said:
            progress(
                f"lab start: {line}, {count} of {lab.engines} engines registered ({waited:.0f} s)"
            )
            said = line + str(count)
        if state == "PENDING" and waited > lab.pending_limit:
            raise TimeoutError(
                f"Slurm job {job} still PENDING after {lab.pending_limit:g} s (Slurm's reason: "
                f"{reason}): ask for fewer nodes or a shorter time, or raise pending_limit"
            )
        if state not in ("PENDING", "CONFIGURING", "RUNNING"):
            raise RuntimeError(_job_line(job, record, lab.env())[1])
        if state == "RUNNING":
            queued_until = queued_until or time.monotonic()
            if time.monotonic() - queued_until > timeout:
                raise TimeoutError(
                    f"Slurm job {job} runs, but {lab.engines - count} of {lab.engines} engines "
                    f"did not register within {timeout:g} s: can the nodes reach "
                    f"{lab.controller_ip}? (their output: the profile's log folder)"
                )
        time.sleep(1.0)
    progress(f"lab start: {lab.engines} of {lab.engines} engines registered (Slurm job {job})")


def _job_of(lab: SlurmLab) -> str | None:
    from course_kit.lab.cluster import _security

    security = _security(lab)  # type: ignore[arg-type]
    try:
        return str(json.loads((security / JOB_FILE).read_text())["job"]) if security else None
    except (OSError, ValueError, KeyError):
        return None


def slurm_status(lab: SlurmLab) -> tuple[bool, str]:
    """Return (the job runs and every engine answers, the job's line, engines per node, seats)."""
    import ipyparallel as ipp

    from course_kit.lab.cluster import _is_running, _security
    from course_kit.lab.roster import read_roster
    from course_kit.lab.seats import seat_lines

    job = _job_of(lab)
    if not _is_running(lab) or job is None:  # type: ignore[arg-type]
        return False, f"no lab cluster is running in profile {lab.profile!r}"
    running, line = _job_line(job, slurm_job_state(job, lab.env()), lab.env())
    security = _security(lab)  # type: ignore[arg-type]
    roster = read_roster(security)
    with ipp.Client(str(security / "ipcontroller-client.json")) as client:
        registered = set(client.ids)
    per_node: dict[str, list[int]] = {}
    for eid, row in sorted(roster.items()):
        per_node.setdefault(str(row.get("pc")), []).append(eid)
    lines = [f"  {line}"]
    for node, ids in sorted(per_node.items()):
        alive = [eid for eid in ids if eid in registered]
        lines.append(f"  {node}: {len(alive)} of {len(ids)} engines registered")
    ok = running and len(registered) >= lab.engines
    head = f"lab cluster {'OK' if ok else 'INCOMPLETE'}: {len(registered)} of {lab.engines} "
    head += f"engines registered at the controller (profile {lab.profile!r}, Slurm job {job})"
    return ok, "\n".join([head, *lines, *seat_lines(security)])


def stop_slurm_lab(lab: SlurmLab) -> bool:
    """Cancel the job, stop the controller and the seat service; False: none was running."""
    from course_kit.lab.cluster import _is_running, _leftovers, _load, _security, _teardown

    running = _is_running(lab)  # type: ignore[arg-type]
    if not running and not _leftovers(lab):  # type: ignore[arg-type]
        return False
    job = _job_of(lab)
    with _slurm_environment(lab):
        cluster = _load(lab) if running else None  # type: ignore[arg-type]
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.stop_cluster_sync()
        _teardown(cluster if cluster is not None else object(), lab)  # type: ignore[arg-type]
        if job is not None:  # whatever ipyparallel could not cancel
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
    if (security := _security(lab)) is not None:  # type: ignore[arg-type]
        (security / JOB_FILE).unlink(missing_ok=True)
    return True


MPI_JOB_NAME = "course-lab-mpi"


def slurm_mpi_command(lab: SlurmLab, argv: Sequence[str], n: int | None = None) -> list[str]:
    """Return ``salloc`` running MPICH's ``mpiexec`` for ``argv`` as ``n`` ranks (default: every slot).

    MPICH's own launcher inside the allocation (hydra starts its proxies with ``srun``; the ranks
    speak PMI-1 to them, as over SSH) rather than ``srun --mpi=pmi2``: Slurm 22.05's PMI-2 server
    and MPICH 5's client lost step under load (slurmstepd: "value not properly terminated in
    client request", a rank's garbage instead of a request), and the job hung until killed.
    """
    n = lab.engines if n is None else n
    if not 1 <= n <= lab.engines:
        raise ValueError(f"--ranks {n}: use 1..{lab.engines} (nodes x tasks_per_node)")
    if not argv:
        raise ValueError("no command: ./kit lab mpi SLURM.toml -- python my_script.py")
    nodes = min(lab.nodes, n)
    command = ["salloc", f"--job-name={MPI_JOB_NAME}", f"--nodes={nodes}", f"--ntasks={n}"]
    command += [f"--time={lab.time}", f"--immediate={max(1, int(lab.pending_limit))}"]
    command += [f"--partition={lab.partition}"] if lab.partition else []
    command += [f"--account={lab.account}"] if lab.account else []
    mpiexec = Path(lab.python).parent / "mpiexec"  # the venv's, at one path on every node
    options = [opt for name, value in MPI_ENV.items() for opt in ("-genv", name, value)]
    # Hydra is handed the allocation's hosts: its own parser of Slurm's node list dies (SIGFPE)
    # on names such as pc1-a7 (course_kit/lab/slurm_hosts.py).
    hosts = [sys.executable, "-m", "course_kit.lab.slurm_hosts"]
    return [*command, *hosts, str(mpiexec), *options, "-n", str(n), *argv]


def run_slurm_mpi(lab: SlurmLab, argv: Sequence[str], n: int | None = None) -> int:
    """Run ``argv`` as MPI ranks in an allocation of its own; interrupted, the allocation goes too."""
    command = slurm_mpi_command(lab, argv, n)
    env = slurm_mpi_env(lab)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return subprocess.run(command, env=env).returncode
    except KeyboardInterrupt:
        user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
        scancel = ["scancel", f"--name={MPI_JOB_NAME}"] + ([f"--user={user}"] if user else [])
        subprocess.run(scancel, env=env, capture_output=True, timeout=60)
        print(f"lab mpi interrupted: its Slurm allocation ({MPI_JOB_NAME}) is cancelled")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def slurm_mpi_env(lab: SlurmLab) -> dict[str, str]:
    """Return the environment of ``lab mpi``: Slurm's, and TCP only for MPI's data (see lab.mpi)."""
    return dict(os.environ, **lab.env(), **MPI_ENV)
