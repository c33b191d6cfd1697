"""Lecture 4 in a student's browser, on the emulated room's cluster (the lab as a class meets it).

The instructor brings up a room of 2 PCs x 2 engines (``./kit room up 2 --engines 2``) and starts
the lab on it (``./kit lab start HOSTS``). A student's JupyterLab, started as ``./kit lab`` starts
it with ``COURSE_CLUSTER_FILE`` pointing at the lab and an IPython folder of its own, opens lecture
4 in headless Chromium and runs it through the Run menu. The page must say the lecture got a seat
of the room's cluster and show no error; once the student's Lab has stopped, ``lab status`` says
the seat is free, and the room goes down leaving no process behind. Root only (the room);
skipped with the reason where there is no room or no browser. Deselect with ``-m "not room"``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser_lab import REPO, JupyterLabServer, NotebookPage, browser_skip_reason, open_browser
from browser_lab import tracebacks as error_outputs

from course_lib.cluster.room.build import room_unavailable_reason
from course_lib.cluster.room.state import lab_folder, read_state, room_down

pytestmark = [
    pytest.mark.room,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(browser_skip_reason() is not None, reason=str(browser_skip_reason())),
    pytest.mark.xdist_group("browser"),
]

LECTURE = "04_data_parallel.ipynb"  # start_cluster(n=4), no MPI: the room's 4 engines, one seat


def _kit(env: dict[str, str], *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m course_lib.cluster ARGV`` (what ``./kit ARGV`` runs)."""
    return subprocess.run(
        [sys.executable, "-m", "course_lib.cluster", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def _pids_in(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def _wait_for(condition, what: str, within: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"waited {within:g} s for {what}"
        time.sleep(0.5)


@pytest.fixture
def room_lab(tmp_path: Path):
    """The instructor's room (2 PCs x 2 engines) with the lab started; afterwards both are gone."""
    reason = room_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")
    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "instructor"), OMP_NUM_THREADS="1")
    state = tmp_path / "room.json"
    hosts_file = lab_folder(state) / "hosts.toml"
    try:
        up = _kit(env, "room", "--state", str(state), "up", "2", "--engines", "2")
        assert up.returncode == 0, up.stdout + up.stderr
        started = _kit(env, "lab", "start", str(hosts_file), "--timeout", "600")
        assert started.returncode == 0, started.stdout + started.stderr[-3000:]
        assert "4 engines on 2 PCs answered" in started.stdout, started.stdout
        yield env, state, hosts_file
    finally:
        if hosts_file.exists():  # what a failed test left running
            _kit(env, "lab", "stop", str(hosts_file), timeout=120)
        room_down(state)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = open_browser(playwright)
        yield chromium
        chromium.close()


def test_lecture4_runs_on_a_seat_of_the_rooms_cluster_in_the_browser(
    room_lab, browser, tmp_path: Path
) -> None:
    """Run → Run All Cells on lecture 4 connected to the lab: the room's engines, no error."""
    env, state, hosts_file = room_lab
    room = read_state(state)
    stored = hashlib.sha256((REPO / "notebooks" / LECTURE).read_bytes()).digest()
    client_file = tmp_path / "instructor" / "profile_lab" / "security" / "ipcontroller-client.json"
    student = dict(env, IPYTHONDIR=str(tmp_path / "student"), COURSE_CLUSTER_FILE=str(client_file))
    server = JupyterLabServer(env=student)
    server.start()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)  # a loaded 2-core machine: clicks may wait for the page
        notebook = NotebookPage(page, server)
        notebook.open(LECTURE)
        notebook.clear_outputs()  # what is checked below comes from this run
        cells = [c for c in notebook.run_all(timeout=1500) if c["kind"] == "code"]
        page.close()
        log = server.log[-3000:]
    finally:
        server.stop()  # the kernel shuts down with the server

    # The first cluster cell printed which cluster it got: a seat of the room's, on both PCs.
    first = next(c for c in cells if "start_cluster(" in c["source"])
    where = [line for line in first["text"].splitlines() if line.startswith("course_lib: ")]
    told = student.get("COURSE_CLUSTER_FILE", "not set")
    assert where and "4 engines of the room's cluster" in where[0], (
        f"lecture 4 did not run on the room's cluster (COURSE_CLUSTER_FILE={told}); "
        f"its first cluster cell printed:\n{first['text'][:1500]}"
    )
    for pc in room.pcs:
        assert f"{pc.hostname} (2)" in where[0], f"not 2 engines on {pc.hostname}: {where[0]}"
    prompts = [c["prompt"] for c in cells]
    assert prompts == [f"[{i}]:" for i in range(1, len(cells) + 1)], (
        f"not every cell ran, in order, once: {prompts}\n{error_outputs(cells)}\n{log}"
    )
    assert not error_outputs(cells), "\n".join(error_outputs(cells))
    assert not any(c["widgetErrors"] for c in cells), "a widget failed to display"
    # The exercise's check ran on the seat's engines and passed (the lecture's answer is given).
    verdicts = [c["text"] for c in cells if "check_parameter_server(" in c["source"]]
    assert verdicts and "Exercise 4.1 parameter server: PASS" in verdicts[0], verdicts
    assert not server.leftovers, f"processes outlived JupyterLab's shutdown: {server.leftovers}"
    assert hashlib.sha256((REPO / "notebooks" / LECTURE).read_bytes()).digest() == stored, (
        f"{LECTURE} was modified on disk"
    )
    # The student's Lab is gone: its seat is free again, then the instructor ends the class.
    deadline = time.monotonic() + 120
    while "seats: 0 held" not in (status := _kit(env, "lab", "status", str(hosts_file)).stdout):
        assert time.monotonic() < deadline, f"the seat was not given back within 120 s:\n{status}"
        time.sleep(0.5)
    stopped = _kit(env, "lab", "stop", str(hosts_file))
    assert stopped.returncode == 0 and "lab cluster stopped" in stopped.stdout, stopped.stderr
    for pc in room.pcs:
        _wait_for(lambda pc=pc: not _pids_in(pc.netns), f"no process left in {pc.hostname}", 120)
    down = _kit(env, "room", "--state", str(state), "down")
    assert down.returncode == 0 and not hosts_file.parent.exists(), down.stdout + down.stderr
