"""A class in the emulated room with the lab's own commands: seats for a room of students.

``./kit room up 3 --engines 2 --seat 2`` writes the hosts file (seats of 2 engines) and SSH
stand-ins, ``./kit lab start`` starts the cluster over them; three students' notebooks (processes
inside different PCs' namespaces, pointed at the room by ``COURSE_CLUSTER_FILE``) ask for 4
engines as the lectures do, each is dealt a seat of 2 of its own and says so, and they train
lecture 4's check network with the ring at the same time, each equal to one process; a fourth student finds no free
seat and is told so in one line. Then ``lab start`` against an unreachable PC, and a start that
fails after it began: both leave nothing behind. Deselect with ``-m "not room"``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from room_helpers import kit, pids_in

from course_kit.lab.preflight import leftover_controllers
from course_kit.room.build import emulated_room, room_unavailable_reason
from course_kit.room.ssh import write_lab_files
from course_kit.room.state import lab_folder, read_state, room_down
from course_lib.cluster import connect_cluster, start_cluster

pytestmark = [pytest.mark.room, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[3]
STUDENT = Path(__file__).resolve().parents[2] / "lab_student.py"


def _wait_for(condition, what: str, within: float = 300.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + within
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {within:g} s for {what}"
        time.sleep(0.3)
    return value


@pytest.fixture
def room_env(tmp_path: Path):
    """Skip without a room; yield the instructor's environment; stop the lab, remove the room."""
    reason = room_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")
    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "instructor"), OMP_NUM_THREADS="1")
    yield env
    for hosts in tmp_path.rglob("hosts*.toml"):  # whatever a failed test left running
        kit(env, "lab", "stop", str(hosts), timeout=120)
    room_down(tmp_path / "room.json")


def _student(room, k: int, out: Path, env: dict, n: int, mode: str) -> subprocess.Popen:  # noqa: ANN001
    """Start a student's notebook process inside PC ``k`` (0-based) of ``room``."""
    argv = [sys.executable, str(STUDENT), str(out), str(n), mode]
    return subprocess.Popen(
        room.command(room.pcs[k], argv),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_three_students_hold_seats_of_their_own_and_a_fourth_is_told(
    room_env: dict, tmp_path: Path
) -> None:
    from course_lib.checks.lecture04 import CHECK_CONFIG, check_digits, check_net
    from course_lib.parallel.data_parallel.reference import (
        max_weight_difference,
        train_one_process,
        weights_match,
    )

    state = tmp_path / "room.json"
    up = kit(room_env, "room", "--state", str(state), "up", "3", "--engines", "2", "--seat", "2")
    assert up.returncode == 0, up.stdout + up.stderr
    hosts_file = lab_folder(state) / "hosts.toml"
    assert f"./kit lab start {hosts_file}" in up.stdout, up.stdout  # it says where
    room = read_state(state)
    started = kit(room_env, "lab", "start", str(hosts_file), "--timeout", "600")
    assert started.returncode == 0, started.stdout + started.stderr[-3000:]
    assert "lab start: 6 of 6 engines registered" in started.stdout, started.stdout
    assert "6 engines on 3 PCs answered" in started.stdout
    security = tmp_path / "instructor" / "profile_lab" / "security"
    out = tmp_path / "class"
    out.mkdir()
    env = dict(room_env, COURSE_CLUSTER_FILE=str(security / "ipcontroller-client.json"))
    students = []
    for k, mode in enumerate(("train", "train", "exit")):  # the third's kernel dies at the end
        student_env = dict(env, IPYTHONDIR=str(tmp_path / f"student{k}"))
        students.append(_student(room, k, out, student_env, 4, mode))  # as a lecture asks
    ready = _wait_for(
        lambda: (
            len(list(out.glob("ready-*.json"))) == 3
            and [json.loads(p.read_text()) for p in out.glob("ready-*.json")]
        ),
        "three students to take their seats",
    )
    seats = [set(r["ids"]) for r in ready]
    assert all(r["kind"] == "connect" and len(r["ids"]) == 2 for r in ready), ready
    assert len(set.union(*seats)) == 6, f"seats overlap: {seats}"
    for r in ready:  # a seat spreads over PCs, and the cluster says which, and that it is smaller
        assert len(set(r["hosts"])) == 2 and "of the room's cluster" in r["where"], r
        assert "the room's seats are 2 engines (this notebook asked for 4)" in r["where"], r
    status = kit(room_env, "lab", "status", str(hosts_file))
    assert "seats: 3 held (seats of 2 engines)" in status.stdout, status.stdout
    # A fourth student: no free seat, one line, and local engines instead.
    fourth = _student(room, 0, out, dict(env, IPYTHONDIR=str(tmp_path / "student3")), 1, "hold")
    said, _ = fourth.communicate(timeout=300)
    assert fourth.returncode == 0, said
    told = [line for line in said.splitlines() if "no free seat" in line]
    assert len(told) == 1 and "local engines" in told[0], said
    assert len(list(out.glob("ready-*.json"))) == 4
    assert "1 local engines on this PC" in said, said
    # All three train at the same time, each on its own engines.
    (out / "go").touch()
    for proc in students:
        text, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, text[-3000:]
    reference = train_one_process(check_net, check_digits, CHECK_CONFIG)
    weights = sorted(out.glob("weights-*.npz"))
    assert len(weights) == 3
    for path in weights:
        got = dict(np.load(path))
        assert weights_match(got, reference), (path, max_weight_difference(got, reference))
    # The seats are free again (two closed, one dropped with its process): the whole room.
    _wait_for(
        lambda: "seats: 0 held" in kit(room_env, "lab", "status", str(hosts_file)).stdout,
        "the seats to be given back",
        within=60,
    )
    with connect_cluster(connection_file=env["COURSE_CLUSTER_FILE"], timeout=60) as demo:
        assert demo.world_size == 6 and demo.seat is not None
    stopped = kit(room_env, "lab", "stop", str(hosts_file))
    assert stopped.returncode == 0 and "lab cluster stopped" in stopped.stdout, stopped.stderr
    assert not (security / "lab-seats.json").exists()
    down = kit(room_env, "room", "--state", str(state), "down")
    assert down.returncode == 0 and not hosts_file.parent.exists(), down.stdout + down.stderr


def test_lab_start_names_an_unreachable_pc_and_leaves_nothing(
    room_env: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    security = tmp_path / "instructor" / "profile_lab" / "security"
    profile_dir = str(security.parent)
    with emulated_room(3) as room:
        hosts_file = write_lab_files(room, tmp_path / "lab")
        cut = room.pcs[2]
        subprocess.run(["ip", "link", "set", cut.host_veth, "down"], check=True)
        failed = kit(room_env, "lab", "start", str(hosts_file))
        assert failed.returncode == 2, failed.stdout + failed.stderr
        assert "Traceback" not in failed.stderr
        named = [line for line in failed.stderr.splitlines() if cut.hostname in line]
        assert len(named) == 1 and "SSH cannot reach it" in named[0], failed.stderr
        assert not any(pc.hostname in failed.stderr for pc in room.pcs[:2]), failed.stderr
        assert leftover_controllers(profile_dir) == []
        assert not (security / "ipcontroller-client.json").exists()
        # The next start, without that PC, succeeds; stop ends it.
        text = hosts_file.read_text()
        without = tmp_path / "lab" / "hosts-without.toml"
        without.write_text(text.replace(f'\n[[pc]]\nhost = "{cut.hostname}"\n', ""))
        started = kit(room_env, "lab", "start", str(without), "--timeout", "600")
        assert started.returncode == 0, started.stdout + started.stderr[-3000:]
        assert "2 engines on 2 PCs answered" in started.stdout, started.stdout
        # A notebook's start_cluster(n=...) connects to the room when the environment says so.
        monkeypatch.setenv("IPYTHONDIR", room_env["IPYTHONDIR"])
        monkeypatch.setenv("COURSE_CLUSTER_PROFILE", "lab")
        with start_cluster(n=2, timeout=120) as student:
            hosts = sorted(student.view.apply_sync(socket.gethostname))
            assert student.kind == "connect" and hosts == sorted(pc.hostname for pc in room.pcs[:2])
            assert "2 engines of the room's cluster (profile 'lab')" in student.where()
        stopped = kit(room_env, "lab", "stop", str(without))
        assert stopped.returncode == 0, stopped.stderr
        # A start that fails after it began (engines not up in time) stops what it started.
        subprocess.run(["ip", "link", "set", cut.host_veth, "up"], check=True)
        late = kit(room_env, "lab", "start", str(hosts_file), "--timeout", "0.01")
        assert late.returncode == 2 and "stopped again" in late.stderr, late.stdout + late.stderr
        assert "Traceback" not in late.stderr
        assert leftover_controllers(profile_dir) == []
        assert not list(security.glob("*.json")), list(security.glob("*.json"))
        for pc in room.pcs:
            _wait_for(lambda pc=pc: not pids_in(pc.netns), f"no engine left in {pc.hostname}", 120)
        status = kit(room_env, "lab", "status", str(hosts_file))
        assert "no lab cluster is running" in status.stdout, status.stdout
