"""``./kit lab start``'s check of every PC before it starts anything: one line per PC not ready.

Real ``ssh`` is replaced by a stand-in that runs the command on this machine (as the emulated
room's does inside a namespace), so each kind of bad PC is real: a PC SSH cannot reach, a
Python that is not there, a Python without the kit, a Python whose versions differ.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

import psutil
import pytest

from course_kit.lab.hosts import LabHosts, LabPC
from course_kit.lab.preflight import check_pcs

STAND_IN = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -o) shift 2 ;; -*) shift ;; *) break ;; esac; done
host=$1; shift
case "$host" in
    off) echo "ssh: connect to host off port 22: No route to host" >&2; exit 255 ;;
    bare) cd / && exec env -u PYTHONPATH sh -c "$*" ;;
esac
exec sh -c "$*"
"""


def test_every_pc_not_ready_gets_one_line_naming_the_fix(tmp_path: Path) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text(STAND_IN)
    ssh.chmod(0o755)
    system_python = shutil.which("python3", path="/usr/bin")
    if system_python is None or Path(system_python).resolve() == Path(sys.executable).resolve():
        pytest.skip("needs a system python3 other than the kit's")
    hosts = LabHosts(
        pcs=(
            LabPC("ready", 1, sys.executable),
            LabPC("off", 1, sys.executable),
            LabPC("nopython", 1, str(tmp_path / "no" / "python")),
            LabPC("bare", 1, system_python),  # a Python without the kit (no PYTHONPATH there)
            LabPC("other", 1, system_python),  # the kit on its path, but other versions
        ),
        ssh=(str(ssh),),
        path=tmp_path / "hosts.toml",
    )
    lines = check_pcs(hosts, timeout=60)
    by_pc = {line.split(":")[0]: line for line in lines}
    assert len(lines) == len(by_pc) == 4, lines  # one line per bad PC, none for the ready one
    assert "SSH cannot reach it (ssh: connect to host off" in by_pc["off"]
    assert "no working Python at" in by_pc["nopython"]
    assert "versions differ" in by_pc["other"] and "install the same kit" in by_pc["other"]
    assert "the kit is not installed for" in by_pc["bare"]


def test_status_and_stop_find_a_controller_a_failed_start_left(tmp_path: Path) -> None:
    import os
    import subprocess

    from course_kit.lab.preflight import leftover_controllers

    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "instructor"))
    start = (
        "import ipyparallel as ipp; c = ipp.Cluster(profile='lab', cluster_id='', n=0, "
        "shutdown_atexit=False, log_level=40); c.start_controller_sync()"
    )
    subprocess.run([sys.executable, "-c", start], env=env, check=True, timeout=120)
    profile_dir = tmp_path / "instructor" / "profile_lab"
    (profile_dir / "security" / "cluster-.json").unlink()  # no file names it any more
    assert leftover_controllers(str(profile_dir)), "the controller should still run"
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'[[pc]]\nhost = "lab-pc-01"\npython = "{sys.executable}"\n')

    def kit_lab(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "course_kit.jobs.cluster", "lab", *argv, str(hosts)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    try:
        status = kit_lab("status")
        assert status.returncode == 1 and "a controller an earlier start left" in status.stdout
        start_again = kit_lab("start")
        assert start_again.returncode == 2 and "./kit lab stop" in start_again.stderr
        stopped = kit_lab("stop")
        assert stopped.returncode == 0 and "lab cluster stopped" in stopped.stdout, stopped.stderr
        assert leftover_controllers(str(profile_dir)) == []
    finally:  # whatever a failing check left running
        for pid in leftover_controllers(str(profile_dir)):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    assert not list((profile_dir / "security").glob("ipcontroller-*.json"))
