"""No lecture: the emulated room's rehearsal of the university's cluster (docs/instructor.md, "The university's cluster"): a real Slurm across the room's PCs, ``./kit room up N --slurm``.

Debian's ``slurm-wlm`` and ``munge``, nothing emulated: ``munged`` and ``slurmctld`` run on the
instructor's PC (this machine's network), one ``slurmd`` inside every PC's namespace with the
PC's host name and address, so ``sbatch``, ``srun``, ``squeue`` and ``scancel`` place real jobs
on the PCs and their traffic crosses the room's shaped links. Every file (``slurm.conf``, the
state, logs, the daemons' pids) lives in one folder beside the room's state (the sockets, the
munge key and the spool in ``/tmp/course-slurm-TAG``: a short path, open to all);
``slurm_down`` ends the daemons and the room's teardown removes the rest.

Pitfalls met on these machines (``../shared/notes``): ``ip netns exec`` remounts ``/sys`` and
hides the cgroup mounts ``slurmd`` wants, so a PC's ``slurmd`` is entered with
``nsenter --net`` instead; a PC's ``slurmd`` gets its own mount namespace with the room's
hosts file bound over ``/etc/hosts`` (MPICH's hydra resolves node names), and its job steps
inherit both. A node the admins set DOWN stays down until they resume it
(``ReturnToService=1``), as on a university's cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from course_kit.room.namespaces import Room
from course_lib.files import atomic_write_text

__all__ = ["PARTITION", "slurm_down", "slurm_env", "slurm_unavailable_reason", "slurm_up"]

PARTITION = "room"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo")
PIDS_FILE = "slurm-pids.json"


def slurm_unavailable_reason() -> str | None:
    """Return why no Slurm can run in the room here (not root, packages missing), or None."""
    if os.geteuid() != 0:
        return "a Slurm in the room needs root (its daemons and namespaces)"
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        return (
            f"{', '.join(missing)} not found: install Debian's Slurm and munge "
            "(apt-get install slurm-wlm munge)"
        )
    return None


def slurm_env(folder: Path) -> dict[str, str]:
    """Return what Slurm's commands need to reach this room's Slurm (``SLURM_CONF``)."""
    return {"SLURM_CONF": str(folder / "slurm.conf")}


# Every PC of the room shares this machine's cores; each claims this many CPUs, so the lab's
# engine job and an MPI job (``./kit lab mpi``) fit side by side, as on nodes with cores to spare.
CPUS_PER_PC = 16


def _conf(room: Room, folder: Path) -> str:
    cpus = CPUS_PER_PC
    nodes = "\n".join(
        f"NodeName={pc.hostname} NodeAddr={pc.ip} NodeHostname={pc.hostname} CPUs={cpus} "
        f"Sockets=1 CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
        for pc in room.pcs
    )
    names = ",".join(pc.hostname for pc in room.pcs)
    return f"""\
ClusterName=room{room.tag}
SlurmctldHost={socket.gethostname()}({room.instructor_ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={_munge_dir(room)}/munge.sock
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={folder}/state/ctld
SlurmdSpoolDir={_runtime_dir(room)}/spool/%n
SlurmctldPidFile={folder}/run/slurmctld.pid
SlurmdPidFile={folder}/run/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=1
SlurmdParameters=config_overrides
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
{nodes}
PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _runtime_dir(room: Room) -> Path:
    """Return the folder of the daemons' sockets: a short path, open to all (755).

    munged wants every folder above its socket open to all, and a job step's socket in the
    spool folder must fit a socket path's 108 bytes (a test's deep tmp folder does not).
    """
    import tempfile

    return Path(tempfile.gettempdir()) / f"course-slurm-{room.tag}"


def _munge_dir(room: Room) -> Path:
    return _runtime_dir(room) / "munge"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _spawn(argv: list[str], log: Path) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return proc.pid


def slurm_up(room: Room, folder: Path, timeout: float = 60.0) -> dict[str, str]:
    """Start munge, the controller and a ``slurmd`` per PC; return :func:`slurm_env`.

    Waits until ``sinfo`` shows every PC idle; on failure ends what it started and raises
    RuntimeError naming the daemon's log.
    """
    if (reason := slurm_unavailable_reason()) is not None:
        raise RuntimeError(reason)
    for sub in ("state/ctld", "log", "run"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    runtime, munge = _runtime_dir(room), _munge_dir(room)
    for sub in ("munge", *(f"spool/{pc.hostname}" for pc in room.pcs)):
        (runtime / sub).mkdir(parents=True, exist_ok=True)
    runtime.chmod(0o755)
    munge.chmod(0o755)
    (folder / "runtime-dir").write_text(str(runtime))  # for slurm_down
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    conf = folder / "slurm.conf"
    conf.write_text(_conf(room, folder))
    pids: dict[str, int] = {}
    try:
        pids["munged"] = _spawn(
            ["munged", "-F", f"--key-file={key}", f"--socket={munge}/munge.sock",
             f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
             f"--seed-file={munge}/munged.seed"],
            folder / "log" / "munged.stdout",
        )  # fmt: skip
        _wait_for(lambda: (munge / "munge.sock").exists(), 10, folder / "log" / "munged.stdout")
        pids["slurmctld"] = _spawn(
            ["slurmctld", "-D", "-i", "-f", str(conf)], folder / "log" / "slurmctld.stdout"
        )
        for pc in room.pcs:
            hosts = Path("/etc/netns") / pc.netns / "hosts"  # the room's: every PC by name
            inner = (
                f"mount --bind {hosts} /etc/hosts && hostname {pc.hostname} && "
                f"exec slurmd -D -N {pc.hostname} -f {conf}"
            )
            pids[f"slurmd {pc.hostname}"] = _spawn(
                ["nsenter", f"--net=/run/netns/{pc.netns}", "unshare", "-u", "-m", "sh", "-c",
                 inner],
                folder / "log" / f"slurmd-{pc.hostname}.stdout",
            )  # fmt: skip
        _write_pids(folder, pids)
        env = dict(os.environ, **slurm_env(folder))

        def all_idle() -> bool:
            done = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True
            )
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            return all(states.get(pc.hostname, "").startswith("idle") for pc in room.pcs)

        _wait_for(all_idle, timeout, folder / "log")
    except BaseException:
        _write_pids(folder, pids)
        slurm_down(folder)
        raise
    return slurm_env(folder)


def _wait_for(condition, within: float, log: Path) -> None:  # noqa: ANN001
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            logs = [log] if log.is_file() else sorted(log.glob("*")) if log.is_dir() else []
            tail = [ln for path in logs for ln in path.read_text(errors="replace").splitlines()]
            said = " / ".join(ln for ln in tail if "rror" in ln)[-400:] or "no error logged"
            raise RuntimeError(f"Slurm in the room did not come up within {within:g} s: {said}")
        time.sleep(0.2)


def _write_pids(folder: Path, pids: dict[str, int]) -> None:
    atomic_write_text(folder / PIDS_FILE, json.dumps(pids))


def slurm_down(folder: Path, wait: float = 10.0) -> list[str]:
    """End the room's Slurm daemons (its jobs end with their ``slurmd``); return what would not."""
    import psutil

    path = folder / PIDS_FILE
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    procs = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)  # the daemon and what it started (job steps)
        with contextlib.suppress(psutil.Error):
            procs[name] = psutil.Process(pid)
    _, alive = psutil.wait_procs(list(procs.values()), timeout=wait)
    for proc in alive:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    _, still = psutil.wait_procs(alive, timeout=wait)
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        shutil.rmtree((folder / "runtime-dir").read_text().strip(), ignore_errors=True)
    return [f"{name} (pid {proc.pid}) did not end" for name, proc in procs.items() if proc in still]
