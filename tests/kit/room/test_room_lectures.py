"""Every lecture that uses engines, run by a student connected to the emulated room's cluster.

The instructor's commands: ``./kit room up 2 --engines 2 --mpi-ranks 4`` (two PCs, two engines
each, and an MPI world of four ranks across them) and ``./kit lab start``. A student's notebook
server is pointed at the room by ``COURSE_CLUSTER_FILE``, as in the lab; each lecture then runs
top to bottom under nbval exactly as the test command runs it on local engines (the same
``--nbval-lax`` and tagged output checks). The room's seat log shows that every ``start_cluster``
call of the lecture took a seat of the room (MPI ranks for the MPI cells of lectures 0 and 3,
whose recovery demo restarts the room's MPI world), and ``lab status`` that every seat came back
when the kernel ended. Lectures that start no engines (1, 2) are not run here. Deselect with
``-m "not room"``. Each lecture runs once: where this test runs, ``tests/conftest.py`` deselects
the lecture's local nbval run (the same cells on local engines).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from room_helpers import kit_after

from course_kit.lab.seats import SEATS_LOG
from course_kit.room.build import missing_prerequisite, room_unavailable_reason
from course_kit.room.state import lab_folder, room_down

pytestmark = [pytest.mark.room, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[3]
START = re.compile(r"\bstart_cluster\((.*)\)")
_kit = kit_after(900)  # the lectures' jobs take longer
#: A lecture's run: nbval and pytest-timeout alone, with PYTEST_DISABLE_PLUGIN_AUTOLOAD (the test
#: command's --nbval-lax, cell timeout and timeout come from pyproject.toml). pytest's other
#: installed plugins (hypothesis, anyio, xdist) play no part in a notebook's run and cost each
#: lecture's pytest about 1.1 s of CPU to import.
NBVAL = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "nbval.plugin",
         "-p", "pytest_timeout", "-q"]  # fmt: skip


def _start_calls(notebook: Path) -> list[str]:
    """Return the arguments of every ``start_cluster(...)`` call in the notebook's code cells."""
    cells = json.loads(notebook.read_text())["cells"]
    return [
        match.group(1)
        for cell in cells
        if cell["cell_type"] == "code"
        for match in START.finditer("".join(cell["source"]))
    ]


LECTURES = [
    path for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")) if _start_calls(path)
]


@pytest.fixture(scope="module")
def room(tmp_path_factory: pytest.TempPathFactory):
    """The instructor's room and lab; yield (the student's environment, hosts file, security)."""
    reason = room_unavailable_reason()
    if reason is not None and missing_prerequisite() is None:  # tests/conftest.py left them here
        pytest.fail(
            f"the lectures run only here where a room can be built, and it cannot: {reason}; "
            "run the suite with -m 'not room' to run them on local engines"
        )
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")
    folder = tmp_path_factory.mktemp("room-lectures")
    instructor = dict(os.environ, IPYTHONDIR=str(folder / "instructor"), OMP_NUM_THREADS="1")
    state = folder / "room.json"
    hosts = lab_folder(state) / "hosts.toml"
    try:
        up = _kit(instructor, "room", "--state", str(state), "up", "2", "--engines", "2",
                  "--mpi-ranks", "4")  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        started = _kit(instructor, "lab", "start", str(hosts), "--timeout", "600")
        assert started.returncode == 0, started.stdout + started.stderr[-3000:]
        assert "4 engines (and 4 MPI ranks) on 2 PCs answered" in started.stdout, started.stdout
        security = folder / "instructor" / "profile_lab" / "security"
        student = {
            k: v for k, v in os.environ.items() if not k.startswith("COURSE_CLUSTER_")
        }  # fmt: skip
        student.update(
            COURSE_CLUSTER_FILE=str(security / "ipcontroller-client.json"),
            IPYTHONDIR=str(folder / "student"),
        )
        yield student, instructor, hosts, security
    finally:
        _kit(instructor, "lab", "stop", str(hosts), timeout=300)
        room_down(state)


@pytest.mark.parametrize("lecture", LECTURES, ids=lambda path: path.stem)
def test_lecture_runs_on_the_rooms_cluster(room, lecture: Path) -> None:  # noqa: ANN001
    student, instructor, hosts, security = room
    log = security / SEATS_LOG

    def seat_log() -> list[str]:
        return log.read_text().splitlines() if log.is_file() else []

    before = seat_log()
    started = time.monotonic()
    run = subprocess.run(
        [*NBVAL, str(lecture)],
        env=dict(student, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
        capture_output=True,
        text=True,
        timeout=1100,
        cwd=ROOT,
    )
    seconds = time.monotonic() - started
    print(f"\n{lecture.name} on the room's cluster: {seconds:.0f} s")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # Every start_cluster call of the lecture took a seat of the room (none fell back to this PC),
    # except those that ask for this PC's engines by name ("local": lecture 15's 8-engine grid).
    taken = [line for line in seat_log()[len(before) :] if " to " in line]
    calls = [call for call in _start_calls(lecture) if not call.startswith('"local"')]
    assert len(taken) == len(calls), (calls, taken)
    mpi_calls = sum('"mpi"' in call for call in calls)
    assert sum(": MPI ranks [" in line for line in taken) == mpi_calls, (calls, taken)
    # The kernel has ended: every seat is back, and every engine and MPI rank still answers.
    deadline = time.monotonic() + 60
    while "seats: 0 held" not in (status := _kit(instructor, "lab", "status", str(hosts))).stdout:
        assert time.monotonic() < deadline, f"a seat was not given back: {status.stdout}"
        time.sleep(1)
    assert status.returncode == 0 and "MPI ranks: 4 of 4 answer" in status.stdout, status.stdout
