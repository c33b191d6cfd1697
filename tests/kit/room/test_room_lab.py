"""``./kit lab start | status | stop hosts.toml`` in the emulated room, through the lab's engine
launcher (:mod:`course_kit.lab.launcher`: one SSH call per PC, the PCs at once): ``ssh`` is a
stand-in that runs the launcher's command inside the PC's namespace (:mod:`course_kit.room.ssh`),
so the launcher's own code runs as in a real lab; ``start`` prints a line per PC while it runs.
The same room and cluster then lose engines during the "class" (one of a PC's two engines
killed, another PC's engines killed, a third PC's link cut), and one ``./kit lab add`` repairs
the three in place: the surviving engine keeps its pid and id, only the missing ones start.
Deselect with ``-m "not room"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from room_helpers import pids_in

from course_kit.lab.hosts import read_hosts
from course_kit.room.build import emulated_room, room_unavailable_reason
from course_kit.room.ssh import write_ssh_standins
from course_lib.cluster import connect_cluster

pytestmark = [pytest.mark.room, pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[3]
ENGINES = (2, 1, 1)  # engines on pc1, pc2, pc3
WAIT = 300.0  # seconds to wait for a condition (the heartbeat needs ~12 s; the machine is busy)


def _lab(env: dict[str, str], *argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``python -m course_kit.jobs.cluster lab ARGV`` (what ``./kit lab ...`` runs)."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "course_kit.jobs.cluster", "lab", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    print(f"\nkit lab {argv[0]}: {time.monotonic() - start:.1f} s")
    return done


def _lab_streamed(
    env: dict[str, str], *argv: str, timeout: float = 900
) -> tuple[subprocess.CompletedProcess, list[tuple[float, str]]]:
    """Run ``lab ARGV`` as :func:`_lab` does, noting when each line of its output arrived."""
    command = [sys.executable, "-m", "course_kit.jobs.cluster", "lab", *argv]
    arrivals: list[tuple[float, str]] = []
    with (
        tempfile.TemporaryFile("w+") as errors,  # a file: a full stderr pipe cannot block it
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT
        ) as proc,
    ):
        for line in proc.stdout:  # the job flushes each progress line
            arrivals.append((time.monotonic(), line.rstrip("\n")))
        returncode = proc.wait(timeout=timeout)
        errors.seek(0)
        stderr = errors.read()
    stdout = "\n".join(line for _, line in arrivals)
    return subprocess.CompletedProcess(command, returncode, stdout, stderr), arrivals


def _marked(ipython_dir: str, within: float = 10.0) -> list[int]:
    """Return the pids of processes still running with this IPYTHONDIR after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        left = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("IPYTHONDIR") == ipython_dir and proc.status() != "zombie":
                    left.append(proc.pid)
            except psutil.Error:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _wait_for(condition, what: str, within: float = WAIT):  # noqa: ANN001, ANN202
    """Return ``condition()`` once truthy; fail naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {within:g} s for {what}"
        time.sleep(0.5)
    return value


def _square(x: int) -> int:
    return x * x


def _faults_during_class(env: dict, hosts_file: Path, room, student) -> None:  # noqa: ANN001
    """Kill one of pc1's two engines and all of pc2's, cut pc3's link; the rest works; ``lab add``
    repairs all three in place: pc1's surviving engine keeps running, only the missing start."""
    pc1, killed, cut = room.pcs
    security = Path(env["IPYTHONDIR"]) / "profile_lab" / "security"
    roster = json.loads((security / "lab-roster.json").read_text())
    (lost_id, lost_pid), (kept_id, kept_pid) = sorted(
        (int(eid), row["pid"]) for eid, row in roster.items() if row["pc"] == pc1.hostname
    )
    os.kill(lost_pid, signal.SIGKILL)
    for pid in pids_in(killed.netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "link", "set", cut.host_veth, "down"], check=True)
    try:
        # The controller's heartbeat unregisters the lost engines; status names all three PCs.
        def all_named() -> subprocess.CompletedProcess | None:
            done = _lab(env, "status", str(hosts_file))
            lines = done.stdout.splitlines()
            named = [
                pc.hostname
                for pc in room.pcs
                if any(pc.hostname in ln and "DROPPED OUT" in ln for ln in lines)
            ]
            return done if len(named) == 3 and done.returncode == 1 else None

        status = _wait_for(all_named, "status to name pc1, pc2 and pc3 as dropped out")
        assert f"{pc1.hostname}: 1 of 2 engines answer" in status.stdout, status.stdout
        # The student's client, connected before, keeps working on the engine that remains.
        _wait_for(lambda: student.client.ids == [kept_id], "the student's client to drop 3 engines")
        assert student.client[kept_id].apply_sync(socket.gethostname) == pc1.hostname
        assert student.client.load_balanced_view().map_sync(_square, range(6)) == [
            x * x for x in range(6)
        ]
    finally:
        subprocess.run(["ip", "link", "set", cut.host_veth, "up"], check=True)
    # One command repairs the three; pc1's surviving engine is left as it was (same pid, same id).
    pc1_pids = set(pids_in(pc1.netns))
    added = _lab(env, "add", str(hosts_file), pc1.hostname, killed.hostname, cut.hostname,
                 "--timeout", "600")  # fmt: skip
    assert added.returncode == 0, added.stdout + added.stderr[-3000:]
    assert f"re-added {pc1.hostname}, {killed.hostname}, {cut.hostname}" in added.stdout
    assert pc1_pids <= set(pids_in(pc1.netns)) and psutil.pid_exists(kept_pid)
    again = _lab(env, "add", str(hosts_file), killed.hostname)
    assert again.returncode == 0 and "nothing to add" in again.stdout, again.stdout
    status = _lab(env, "status", str(hosts_file))
    assert status.returncode == 0, status.stdout
    assert f"{pc1.hostname}: 2 of 2 engines answer" in status.stdout, status.stdout
    _wait_for(lambda: len(student.client.ids) == sum(ENGINES), "the student to see 4 engines")
    assert kept_id in student.client.ids
    hosts = sorted(student.client[:].apply_sync(socket.gethostname))
    assert hosts == sorted([pc1.hostname] * 2 + [pc.hostname for pc in room.pcs[1:]])
    # The repaired room computes correctly on every engine, the new ones included.
    assert student.client[:].apply_sync(_square, 7) == [49] * sum(ENGINES)


def _line_of(text: str, word: str) -> str:
    return next(line for line in text.splitlines() if word in line)


def test_lab_cluster_starts_from_a_hosts_file_over_ssh_and_stops_cleanly(tmp_path: Path) -> None:
    reason = room_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")
    with emulated_room(len(ENGINES)) as room:
        ssh, scp = write_ssh_standins(room, tmp_path / "bin")
        pcs = "\n".join(
            f'[[pc]]\nhost = "{pc.hostname}"\nengines = {n}\n'
            for pc, n in zip(room.pcs, ENGINES, strict=True)
        )
        hosts_file = tmp_path / "hosts.toml"
        hosts_file.write_text(
            f'[controller]\nip = "{room.instructor_ip}"\nprofile = "lab"\n\n'
            f'[defaults]\npython = "{sys.executable}"\n\n'
            f'[ssh]\ncommand = ["{ssh}"]\nscp = ["{scp}"]\n\n{pcs}'
        )
        env = dict(os.environ, IPYTHONDIR=str(tmp_path / "instructor"), OMP_NUM_THREADS="1")
        try:
            started, arrivals = _lab_streamed(env, "start", str(hosts_file), "--timeout", "600")
            print(started.stdout, started.stderr[-3000:])
            assert started.returncode == 0, started.stderr[-3000:]
            # A line per PC as its engines are launched, printed while start still runs (well
            # before the last line: registration and the roster follow), elapsed times rising.
            launched = [(at, line) for at, line in arrivals if "engines launched" in line
                        or "engine launched" in line]  # fmt: skip
            assert sorted(line.split(":")[1].strip() for _, line in launched) == sorted(
                pc.hostname for pc in room.pcs
            ), started.stdout
            assert max(at for at, _ in launched) < arrivals[-1][0] - 0.2, arrivals
            elapsed = [int(m) for m in re.findall(r"\((\d+) s\)", started.stdout)]
            assert elapsed == sorted(elapsed) and len(elapsed) >= len(room.pcs), started.stdout
            assert f"{sum(ENGINES)} engines on {len(ENGINES)} PCs answered" in started.stdout
            # The engines run inside the PCs' namespaces, as many as the hosts file asks.
            for pc, n in zip(room.pcs, ENGINES, strict=True):
                assert len(pids_in(pc.netns)) >= n, pc.netns
            status = _lab(env, "status", str(hosts_file))
            assert status.returncode == 0, status.stdout + status.stderr[-2000:]
            for pc, n in zip(room.pcs, ENGINES, strict=True):
                assert f"{pc.hostname}: {n} of {n} engines answer" in status.stdout, status.stdout
            # Without the hosts file, status finds the running lab and the file it started from.
            bare = _lab(env, "status")
            assert bare.returncode == 0, bare.stdout + bare.stderr[-2000:]
            for pc, n in zip(room.pcs, ENGINES, strict=True):
                assert f"{pc.hostname}: {n} of {n} engines answer" in bare.stdout, bare.stdout
            assert f"(hosts file: {hosts_file.resolve()})" in bare.stdout, bare.stdout
            # A student connects with the profile, as on a laptop.
            profile_dir = tmp_path / "instructor" / "profile_lab"
            with connect_cluster(
                connection_file=str(profile_dir / "security" / "ipcontroller-client.json"),
                n=sum(ENGINES),
                timeout=60,
            ) as student:
                hosts = sorted(student.view.apply_sync(socket.gethostname))
                assert hosts == sorted(
                    [room.pcs[0].hostname] * 2 + [pc.hostname for pc in room.pcs[1:]]
                )
                _faults_during_class(env, hosts_file, room, student)
        finally:
            stopped = _lab(env, "stop", str(hosts_file))
        assert stopped.returncode == 0, stopped.stderr[-2000:]
        assert "lab cluster stopped" in stopped.stdout
        # stop left no engine in any PC, and no controller here.
        for pc in room.pcs:
            left = pids_in(pc.netns)
            assert left == [], (pc.netns, left)
        assert _marked(env["IPYTHONDIR"]) == []
        again = _lab(env, "status", str(hosts_file))
        assert again.returncode == 1 and "no lab cluster is running" in again.stdout
        bare = _lab(env, "status")
        assert bare.returncode == 1 and "no lab cluster is running" in bare.stdout, bare.stdout


def test_a_bad_hosts_file_names_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.toml"
    cases = {
        "[[pc]]\nhost = 'a'\nengines = 1\n": "no python",
        "[[pc]]\nhost = 'a'\npython = 'p'\n[[pc]]\nhost = 'a'\npython = 'p'\n": "listed twice",
        "[contoller]\nip = '1.2.3.4'\n": "unknown table",
        "[[pc]]\nhost = 'a'\npython = 'p'\ncores = 4\n": "unknown key(s) cores",
        "[[pc]\n": "not valid TOML",
        "": "no engines",
    }
    for text, fix in cases.items():
        bad.write_text(text)
        with pytest.raises(ValueError, match=fix.replace("(", r"\(").replace(")", r"\)")):
            read_hosts(bad)
    done = _lab(dict(os.environ), "status", str(tmp_path / "missing.toml"), timeout=60)
    assert done.returncode == 2 and "does not exist" in done.stderr
    assert "Traceback" not in done.stderr
