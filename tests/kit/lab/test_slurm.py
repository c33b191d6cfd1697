"""The lab on a real Slurm across the emulated room's PCs: ``./kit room up 3 --slurm``, then the
lab's own commands with the Slurm lab file it writes (``./kit lab start | status | mpi | stop``).

Debian's ``slurm-wlm`` and ``munge``, a ``slurmd`` in every PC's namespace: the engines are a
real Slurm job on three nodes, a notebook connects to them as to a room's cluster, gloo's ring
allreduce across the nodes equals gloo's own, an MPI program runs as ranks on the nodes (MPICH's
``mpiexec`` in an allocation of its own) with its data crossing the room's links, and ``stop``
leaves no job and no engine. A job that stays pending, a job cancelled while a notebook uses it
and a node that goes down each get one line naming the job, the node and Slurm's reason. Skipped with the reason where Slurm cannot
run (not root, packages missing). Deselect with ``-m "not room"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import ipyparallel as ipp
import numpy as np
import pytest
from room_helpers import kit
from test_room import _allreduce_on_engine

from course_kit.lab.slurm import MPI_JOB_NAME
from course_kit.room.build import room_unavailable_reason
from course_kit.room.slurm import slurm_unavailable_reason
from course_kit.room.state import lab_folder, read_state, room_down
from course_lib.cluster import start_cluster
from course_lib.cluster.engine_death import death_message
from course_lib.comm import setup_communicators

pytestmark = [pytest.mark.room, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[3]
NODES, PER_NODE = 3, 2


def _slurm(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _engines_in(netns: str) -> list[str]:
    """Return the command lines of the ipyparallel engines still running in a PC's namespace."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    lines = []
    for pid in done.stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "ipyparallel" in cmdline or "mpi_across_pcs" in cmdline:
            lines.append(cmdline)
    return lines


def _wait_for(condition, what: str, within: float = 120.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + within
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {within:g} s for {what}"
        time.sleep(0.5)
    return value


@pytest.fixture(scope="module")
def slurm_room(tmp_path_factory: pytest.TempPathFactory):
    """A room of three PCs with Slurm across them; yield (env, Slurm's env, lab file, room)."""
    for reason in (room_unavailable_reason(), slurm_unavailable_reason()):
        if reason is not None:
            pytest.skip(f"no Slurm in an emulated room here: {reason}")
    folder = tmp_path_factory.mktemp("slurm-room")
    env = dict(os.environ, IPYTHONDIR=str(folder / "instructor"), OMP_NUM_THREADS="1")
    state = folder / "room.json"
    try:
        up = kit(env, "room", "--state", str(state), "up", str(NODES), "--engines",
                  str(PER_NODE), "--slurm")  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        lab_file = lab_folder(state) / "slurm.toml"
        assert f"./kit lab start {lab_file}" in up.stdout, up.stdout
        slurm_env = dict(env, SLURM_CONF=str(lab_folder(state) / "slurm" / "slurm.conf"))
        yield env, slurm_env, lab_file, read_state(state)
    finally:
        if (lab_folder(state) / "slurm.toml").exists():
            kit(env, "lab", "stop", str(lab_folder(state) / "slurm.toml"), timeout=120)
        room_down(state)


@pytest.fixture(autouse=True)
def _ends_what_it_started(slurm_room):  # noqa: ANN001, ANN202
    """After each test, end what a failure left (the lab's job, an allocation): the next starts clean."""
    yield
    env, slurm_env, lab_file, _ = slurm_room
    stopped = kit(env, "lab", "stop", str(lab_file), timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm_env, capture_output=True,
                          text=True, timeout=60).stdout.split()  # fmt: skip
    if jobs:
        subprocess.run(["scancel", *jobs], env=slurm_env, capture_output=True, timeout=60)
        _wait_for(lambda: not _slurm(slurm_env, "squeue", "-h").strip(), "the queue to empty")


def _slurm_logs(lab_file: Path) -> str:
    """Return the last lines of the room's Slurm logs (what a failure message should show)."""
    lines = []
    for log in sorted((lab_file.parent / "slurm" / "log").glob("*.log")):
        lines += [f"{log.name}: {ln}" for ln in log.read_text(errors="replace").splitlines()[-8:]]
    return "\n".join(lines)


def _start(env: dict[str, str], lab_file: Path) -> str:
    """``lab start`` the Slurm lab; return the job id it names."""
    started = kit(env, "lab", "start", str(lab_file))
    assert started.returncode == 0, (
        started.stdout + started.stderr[-3000:] + "\n" + _slurm_logs(lab_file)
    )
    assert f"{NODES * PER_NODE} engines on {NODES} Slurm nodes answered" in started.stdout
    running = [line for line in started.stdout.splitlines() if "RUNNING" in line]
    assert running, started.stdout  # the queue's state was shown while it waited
    return running[0].split("Slurm job ")[1].split()[0]


def test_engines_through_slurm_a_notebook_connects_and_mpi_crosses_the_links(
    slurm_room, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, slurm_env, lab_file, room = slurm_room
    job = _start(env, lab_file)
    assert _slurm(slurm_env, "squeue", "-h", "-j", job, "-o", "%T").strip() == "RUNNING"
    status = kit(env, "lab", "status", str(lab_file))
    assert status.returncode == 0 and f"Slurm job {job} RUNNING on" in status.stdout, status.stdout
    for pc in room.pcs:
        assert f"{pc.hostname}: {PER_NODE} of {PER_NODE} engines registered" in status.stdout
    # A student's notebook: the same call as in the room, a seat over the three nodes.
    security = Path(env["IPYTHONDIR"]) / "profile_slurm" / "security"
    monkeypatch.setenv("COURSE_CLUSTER_FILE", str(security / "ipcontroller-client.json"))
    with start_cluster(n=NODES, timeout=120) as cluster:
        assert f"a seat of {NODES} engines of the room's cluster" in cluster.where()
        for pc in room.pcs:
            assert f"{pc.hostname} (1)" in cluster.where(), cluster.where()
        setup_communicators(cluster, backend="gloo", timeout=60)
        n = 10_007
        results = cluster.run(_allreduce_on_engine, n, timeout=120)
    expected = sum(
        np.random.default_rng(r).standard_normal(n).astype(np.float32).astype(np.float64)
        for r in range(NODES)
    )
    for res, pc in zip(results, sorted(room.pcs, key=lambda p: p.hostname), strict=False):
        np.testing.assert_allclose(res["ring"], res["builtin"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(res["builtin"], expected, rtol=1e-5, atol=1e-5)
        assert res["ints_equal"]
        others = {other.ip for other in room.pcs} - {pc.ip}
        assert len(others & set(res["peers"])) >= 1, res["peers"]  # talked across the links
    # An MPI program as ranks on the nodes (salloc + mpiexec), its data over the links, not shared memory.
    before = [int(Path(f"/sys/class/net/{pc.host_veth}/statistics/rx_bytes").read_text())
              for pc in room.pcs]  # fmt: skip
    mib = 2.0
    try:
        done = kit(env, "lab", "mpi", str(lab_file), "--ranks", str(NODES), "--", sys.executable,
                    "-m", "course_lib.collectives.mpi_across_pcs", "--mib", str(mib), timeout=300)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("lab mpi hung for 300 s\n" + _slurm_logs(lab_file))
    finally:  # a hung run's allocation must not hold the nodes from the file's next tests
        subprocess.run(["scancel", f"--name={MPI_JOB_NAME}"], env=slurm_env, timeout=60)
    sent = [int(Path(f"/sys/class/net/{pc.host_veth}/statistics/rx_bytes").read_text()) - b
            for pc, b in zip(room.pcs, before, strict=True)]  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:] + _slurm_logs(lab_file)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("ALLREDUCE "))
    report = json.loads(line.removeprefix("ALLREDUCE "))
    assert report["ranks"] == NODES and report["max_error"] == 0.0, report
    assert sorted(report["hosts"]) == sorted(pc.hostname for pc in room.pcs), report
    # The from-scratch ring alone sends 2 (N-1)/N of the buffer per rank (MPI's own allreduce
    # adds what its algorithm sends, which for N = 3 is not a ring's); shared memory: ~0.
    least = 2 * (NODES - 1) / NODES * mib * 2**20
    assert min(sent) >= 0.95 * least, (sent, least)
    # The doctor's network matrix between the Slurm nodes.
    doctor = subprocess.run(
        [sys.executable, "-m", "course_kit", "doctor", "--profile", "slurm", "--network",
         "--mib", "1"],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    # Stop: no job, no engine on any node.
    stopped = kit(env, "lab", "stop", str(lab_file))
    assert stopped.returncode == 0 and "Slurm job is cancelled" in stopped.stdout, stopped.stderr
    _wait_for(lambda: not _slurm(slurm_env, "squeue", "-h").strip(), "the queue to empty")
    for pc in room.pcs:
        _wait_for(lambda pc=pc: not _engines_in(pc.netns), f"no engine left on {pc.hostname}")


def test_a_job_left_pending_is_cancelled_and_said_in_one_line(slurm_room, tmp_path: Path) -> None:
    env, slurm_env, lab_file, _ = slurm_room
    # Another user's job holds every node exclusively: the lab's job waits for resources.
    blocker = _slurm(slurm_env, "sbatch", "--parsable", "--exclusive", f"--nodes={NODES}",
                     f"--output={tmp_path}/blocker.out", "--wrap", "sleep 600").strip()  # fmt: skip
    try:
        _wait_for(
            lambda: (
                _slurm(slurm_env, "squeue", "-h", "-j", blocker, "-o", "%T").strip() == "RUNNING"
            ),
            f"the blocking job to run\n{_slurm_logs(lab_file)}",
        )
        impatient = tmp_path / "slurm.toml"
        impatient.write_text(
            lab_file.read_text().replace("pending_limit = 120", "pending_limit = 5")
        )
        failed = kit(env, "lab", "start", str(impatient))
    finally:
        _slurm(slurm_env, "scancel", blocker)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    said = failed.stderr.strip().splitlines()
    assert len(said) == 1, failed.stderr
    assert "still PENDING after 5 s (Slurm's reason: Resources)" in said[0], said[0]
    assert "the job is cancelled, nothing left" in said[0], said[0]
    job = said[0].split("Slurm job ")[1].split()[0]
    assert job != blocker and job not in _slurm(slurm_env, "squeue", "-h", "-o", "%i").split()
    _wait_for(lambda: not _slurm(slurm_env, "squeue", "-h").strip(), "no job in the queue")
    status = kit(env, "lab", "status", str(impatient))
    assert "no lab cluster is running" in status.stdout, status.stdout


def test_a_cancelled_job_and_a_node_gone_down_are_named_in_one_line(
    slurm_room, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, slurm_env, lab_file, room = slurm_room
    security = Path(env["IPYTHONDIR"]) / "profile_slurm" / "security"
    monkeypatch.setenv("COURSE_CLUSTER_FILE", str(security / "ipcontroller-client.json"))
    # Cancelled (by the admins, or its time limit) while a notebook uses it.
    job = _start(env, lab_file)
    cluster = start_cluster(n=2, timeout=120)
    try:
        running = cluster.view.apply_async(time.sleep, 600)  # a student's cell, mid-training
        cancelled = time.monotonic()
        _slurm(slurm_env, "scancel", job)
        with pytest.raises(ipp.error.CompositeError) as raw:
            running.get(timeout=300)
        heard = time.monotonic() - cancelled
        print(f"\nthe notebook heard of the cancelled job after {heard:.1f} s")
        # One kit line naming the job and what to do, long before the cell would have ended.
        said = death_message(cluster, raw.value)
        assert said is not None and f"the Slurm job {job} that ran" in said, said
        assert "tell the instructor" in said and heard < 120, (heard, said)
        status = _wait_for(  # COMPLETING first, while Slurm ends the job's steps
            lambda: (
                (s := kit(env, "lab", "status", str(lab_file))).returncode == 1
                and f"Slurm job {job} CANCELLED" in s.stdout
                and s
            ),
            "status to see the job cancelled",
        )
        lines = [line for line in status.stdout.splitlines() if f"Slurm job {job}" in line]
        assert any(f"Slurm job {job} CANCELLED" in line for line in lines), status.stdout
        assert any(room.pcs[0].hostname in line for line in lines), status.stdout  # its nodes
        # The notebook's client is alive: it answers, and says what it knows.
        assert isinstance(cluster.client.ids, list)
        assert "engines of the room's cluster" in cluster.where()
    finally:
        cluster.stop()
    assert kit(env, "lab", "stop", str(lab_file)).returncode == 0
    # A node that goes down (switched off, its cable pulled): Slurm ends the job, status says why.
    job = _start(env, lab_file)
    down = room.pcs[1].hostname
    _slurm(slurm_env, "scontrol", "update", f"NodeName={down}", "State=DOWN", "Reason=cable pulled")
    try:
        status = _wait_for(
            lambda: (
                (s := kit(env, "lab", "status", str(lab_file))).returncode == 1
                and f"node {down} is DOWN" in s.stdout
                and s
            ),
            "status to name the node that went down",
        )
        line = next(ln for ln in status.stdout.splitlines() if ln.strip().startswith("Slurm job"))
        assert f"node {down} is DOWN (Slurm's reason: cable pulled)" in line, line
        assert "./kit lab stop" in line, line
    finally:
        # (Slurm may have returned it to service already: its slurmd still answers.)
        subprocess.run(["scontrol", "update", f"NodeName={down}", "State=RESUME"], env=slurm_env,
                       capture_output=True, timeout=60)  # fmt: skip
        assert kit(env, "lab", "stop", str(lab_file)).returncode == 0
    _wait_for(lambda: not _slurm(slurm_env, "squeue", "-h").strip(), "no job in the queue")
