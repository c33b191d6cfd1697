"""``./kit room up N`` / ``status`` / ``run`` / ``down``: a persistent emulated room, on real namespaces.

The commands run as the kit runs them (``python -m course_kit.jobs.cluster room ...``), each in its own
process, with a state file in a temporary folder so that a room an instructor has up is left
alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_kit.room.build import leftovers, room_unavailable_reason
from course_kit.room.state import read_state, room_down

ROOT = Path(__file__).resolve().parents[3]
ECHO_SERVER = """
import socket, sys
with socket.create_server((sys.argv[1], 0)) as server:
    print(server.getsockname()[1], flush=True)
    conn, _ = server.accept()
    with conn:
        conn.sendall(b"echo:" + conn.recv(100) + b" from " + socket.gethostname().encode())
"""
ECHO_CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as conn:
    conn.sendall(b"hello")
    print(conn.recv(200).decode())
"""


def _kit_room(*args: str, env: dict | None = None, timeout: float = 120, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "course_kit.jobs.cluster", "room", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env=env,
        **kwargs,
    )


@pytest.fixture
def state(tmp_path: Path):
    reason = room_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")
    path = tmp_path / "room.json"
    yield path
    room_down(path)  # whatever a failed test left up


@pytest.mark.room
@pytest.mark.timeout(300)
def test_room_up_ping_status_down_and_down_again(state: Path) -> None:
    up = _kit_room("--state", str(state), "up", "2", "--rate", "100mbit")
    assert up.returncode == 0, up.stdout + up.stderr
    room = read_state(state)
    assert room is not None and len(room.pcs) == 2
    names = room.names
    assert leftovers(names) == names  # namespaces, veths and bridge exist after `up` exited
    for pc in room.pcs:  # the printed table: name, IP, and the prefix to run inside the PC
        assert f"{pc.ip}" in up.stdout and f"ip netns exec {pc.netns} CMD" in up.stdout
    qdisc = subprocess.run(
        ["tc", "qdisc", "show", "dev", room.pcs[0].host_veth], capture_output=True, text=True
    ).stdout
    assert "tbf" in qdisc and "100Mbit" in qdisc, qdisc
    pc1, pc2 = room.pcs
    if shutil.which("ping"):
        ping = subprocess.run(
            ["ip", "netns", "exec", pc1.netns, "ping", "-c1", "-W10", pc2.ip],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ping.returncode == 0, ping.stdout + ping.stderr
    # A TCP round trip from pc1 to pc2 by host name, both started with `room run`.
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "course_kit.jobs.cluster",
            "room",
            "--state",
            str(state),
            "run",
            "pc2",
            "--",
            sys.executable,
            "-c",
            ECHO_SERVER,
            pc2.ip,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        port = server.stdout.readline().strip()
        assert port.isdigit(), server.stderr.read()
        client = _kit_room(
            "--state",
            str(state),
            "run",
            "pc1",
            "--",
            sys.executable,
            "-c",
            ECHO_CLIENT,
            pc2.hostname,
            port,
            timeout=60,
        )
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip() == f"echo:hello from {pc2.hostname}"
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    status = _kit_room("--state", str(state), "status")
    assert status.returncode == 0, status.stderr
    assert all(pc.netns in status.stdout and pc.ip in status.stdout for pc in room.pcs)
    sleeper = subprocess.Popen(["ip", "netns", "exec", pc1.netns, "sleep", "600"])
    down = _kit_room("--state", str(state), "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert sleeper.wait(timeout=60) != 0  # `down` stops what still runs inside the PCs
    assert "removed" in down.stdout
    assert leftovers(names) == []
    assert not any(Path("/etc/netns", pc.netns).exists() for pc in room.pcs)
    assert not state.exists()
    again = _kit_room("--state", str(state), "down")
    assert again.returncode == 0 and "no room is up" in again.stdout, again.stderr
    status = _kit_room("--state", str(state), "status")
    assert status.returncode == 0 and "no room is up" in status.stdout


def test_room_without_root_or_tools_is_a_one_line_error(tmp_path: Path) -> None:
    state = str(tmp_path / "room.json")
    bad_rate = _kit_room("--state", state, "up", "2", "--rate", "fast")
    assert bad_rate.returncode != 0
    assert bad_rate.stderr.strip() == (
        "kit room up: rate 'fast': give a tc rate such as 1gbit, 100mbit or 12.5mbps"
    )
    if os.geteuid() != 0:
        checks = [(None, [], "run it with sudo")]
    else:
        home = tmp_path / "home"
        home.mkdir(mode=0o777)
        os.chmod(tmp_path, 0o777)
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        checks = [
            (dict(os.environ, PATH="/nonexistent"), [], "`ip` is not installed: install iproute2"),
        ]
        if shutil.which("setpriv"):
            checks.append((dict(os.environ, HOME=str(home)), as_nobody, "run it with sudo"))
    for env, prefix, fix in checks:
        done = subprocess.run(
            [
                *prefix,
                sys.executable,
                "-m",
                "course_kit.jobs.cluster",
                "room",
                "--state",
                state,
                "up",
                "2",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            env=env,
        )
        assert done.returncode != 0
        assert fix in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not Path(state).exists()
