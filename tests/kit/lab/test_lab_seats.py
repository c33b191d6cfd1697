"""Seats on real processes, without root: a cluster on this machine with the lab's seat service.

Where a lecture's engines come from (the environment decides), and how the seat service deals
engines out: disjoint seats, one line when none is free, local engines offered, and a seat that
comes back when its client closes, dies or goes silent. The same in the emulated room, across
PCs and with three students training at once: ``tests/kit/room/test_room_seats.py``.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import ipyparallel as ipp
import pytest

from course_kit.lab.seats import (
    EXPIRY_SECONDS,
    seat_lines,
    start_seat_service,
    stop_seat_service,
)
from course_lib.cluster import ClusterError, ClusterSettings, connect_cluster, start_cluster
from course_lib.cluster.seat import SEATS_FILE

pytestmark = pytest.mark.timeout(600)
PROFILE = "kit-seats"


def test_the_environment_decides_where_engines_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ClusterSettings.from_environment(n=4)
    assert (settings.kind, settings.n) == ("local", 4)  # no lab named: this PC
    monkeypatch.setenv("COURSE_CLUSTER_FILE", "/lab/ipcontroller-client.json")
    settings = ClusterSettings.from_environment(n=4)
    assert (settings.kind, settings.n) == ("connect", 4)  # the room's cluster
    assert ClusterSettings.from_environment(kind="local", n=4).kind == "local"  # asked for here
    # MPI ranks, in the lab: the room's MPI world (a seat of engines that are MPI ranks).
    settings = ClusterSettings.from_environment(kind="mpi", n=4)
    assert (settings.kind, settings.mpi) == ("connect", True)
    monkeypatch.delenv("COURSE_CLUSTER_FILE")
    settings = ClusterSettings.from_environment(kind="mpi", n=4)
    assert (settings.kind, settings.mpi) == ("mpi", False)  # no lab: MPI ranks on this PC


@pytest.fixture(scope="module")
def seated():
    """Three engines here, a controller of profile kit-seats, and its seat service."""
    running = ipp.Cluster(profile=PROFILE, cluster_id="", n=3, log_level=30)
    running.start_cluster_sync()
    try:
        security = Path(running.profile_dir) / "security"
        with running.connect_client_sync() as client:
            client.wait_for_engines(3, timeout=120, interactive=False)
        start_seat_service(security, "127.0.0.1")
        yield security
    finally:
        stop_seat_service(security)
        running.stop_cluster_sync()


def _held_seats(security: Path) -> int:
    """Return how many seats are held now."""
    return int(seat_lines(security)[0].split()[1])


def test_seats_are_disjoint_and_a_full_room_says_so_in_one_line(seated: Path) -> None:
    with connect_cluster(profile=PROFILE, n=2) as first:
        assert first.world_size == 2 and first.seat is not None
        with pytest.raises(ClusterError) as no_seat:
            connect_cluster(profile=PROFILE, n=2)
        message = str(no_seat.value)
        assert "no free seat of 2 engines: 2 of the room's 3 engines are held by 1" in message
        assert "\n" not in message
        with pytest.raises(ClusterError, match="whole room was asked for, but 1 notebook"):
            connect_cluster(profile=PROFILE)
        with connect_cluster(profile=PROFILE, n=1) as second:
            assert not set(second.ids_by_rank) & set(first.ids_by_rank)
            assert _held_seats(seated) == 2
        taken = set(first.ids_by_rank)
    # Closed: the engines are back; the instructor's demo takes the whole room.
    with connect_cluster(profile=PROFILE) as demo:
        assert demo.world_size == 3 and taken <= set(demo.ids_by_rank)
        assert demo.where().startswith("a seat of 3 engines of the room's cluster")


def test_a_notebook_without_a_seat_is_offered_local_engines(
    seated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("COURSE_CLUSTER_PROFILE", PROFILE)
    with connect_cluster(profile=PROFILE) as demo:  # the whole room is held
        assert demo.world_size == 3
        with start_cluster(n=1) as fallback:
            assert fallback.kind == "local" and fallback.world_size == 1
    said = [line for line in capsys.readouterr().out.splitlines() if "no free seat" in line]
    assert len(said) == 1 and "running on 1 local engines on this PC instead" in said[0]


def test_a_seat_comes_back_when_its_client_dies_or_goes_silent(seated: Path) -> None:
    code = (
        "from course_lib.cluster import connect_cluster; import time; "
        f"c = connect_cluster(profile={PROFILE!r}, n=3); print('held', flush=True); "
        "time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        while (line := holder.stdout.readline()) and line.strip() != "held":
            pass
        assert line.strip() == "held"
        assert _held_seats(seated) == 1
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 30
    while _held_seats(seated) and time.monotonic() < deadline:  # the OS closed its connection
        time.sleep(0.2)
    assert _held_seats(seated) == 0
    # A client that took a seat and then says nothing more (a PC switched off): it expires.
    record = json.loads((seated / SEATS_FILE).read_text())
    from course_lib.cluster.seat import cluster_digest

    with socket.create_connection((record["ip"], record["port"])) as silent:
        take = {
            "op": "take",
            "n": 2,
            "ids": [0, 1, 2],
            "who": "silent",
            "digest": cluster_digest(seated / "ipcontroller-client.json"),
        }
        silent.sendall((json.dumps(take) + "\n").encode())
        assert json.loads(silent.makefile().readline())["ok"]
        assert _held_seats(seated) == 1
        deadline = time.monotonic() + EXPIRY_SECONDS + 60
        while _held_seats(seated) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _held_seats(seated) == 0


def test_running_the_notebooks_cell_again_keeps_one_seat(
    seated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COURSE_CLUSTER_PROFILE", PROFILE)
    cluster = start_cluster(n=3)  # the whole room, as a notebook's first cell
    first = cluster.seat
    cluster = start_cluster(n=3)  # the cell again: the old seat goes back first
    assert first.released and cluster.world_size == 3 and cluster.kind == "connect"
    assert _held_seats(seated) == 1
    del cluster  # a dropped cluster gives its seat back too
    deadline = time.monotonic() + 30
    while _held_seats(seated) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _held_seats(seated) == 0


def test_a_seat_hung_in_plain_python_is_interrupted_not_left_hanging(seated: Path) -> None:
    from course_lib.cluster import EngineTimeout

    with connect_cluster(profile=PROFILE, n=2) as cluster:
        with pytest.raises(EngineTimeout, match="interrupted"):
            cluster.run(time.sleep, 1000, timeout=2)
        # Still asleep (1000 s), they would time out here again.
        assert cluster.run(_answer, timeout=60) == [42, 42]


def _answer() -> int:
    return 42


def test_the_doctor_with_seats_held_says_so_in_one_line(seated: Path) -> None:
    with connect_cluster(profile=PROFILE, n=1):  # a student holds a seat
        doctor = subprocess.run(
            [sys.executable, "-m", "course_kit", "doctor", "--profile", PROFILE],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert doctor.returncode == 1, doctor
    assert "Traceback" not in doctor.stderr and len(doctor.stderr.strip().splitlines()) == 1
    assert "whole room was asked for, but 1 notebook" in doctor.stderr, doctor.stderr


MPI_PROFILE = "kit-seats-mpi"


@pytest.fixture(scope="module")
def seated_mpi():
    """Two engines that are MPI ranks and two that are not, one controller, its seat service."""
    from course_kit.lab.mpi_engines import MPI_ENGINES_FILE
    from course_lib.cluster import find_mpiexec

    running = ipp.Cluster(profile=MPI_PROFILE, cluster_id="", n=2, engines="mpi", log_level=30)
    running.config.MPILauncher.mpi_cmd = [find_mpiexec()]
    running.start_cluster_sync()
    try:
        security = Path(running.profile_dir) / "security"
        with running.connect_client_sync() as client:
            client.wait_for_engines(2, timeout=120, interactive=False)
            ranks = client[:].apply_sync(_mpi_rank)
            mpi_ids = [eid for _, eid in sorted(zip(ranks, client.ids, strict=True))]
            running.engine_launcher_class = "local"
            running.start_engines_sync(n=2)
            client.wait_for_engines(4, timeout=120, interactive=False)
        # What `lab start` records for its MPI world (no mpiexec pid here: the test stops it).
        (security / MPI_ENGINES_FILE).write_text(json.dumps({"ids_by_rank": mpi_ids}))
        start_seat_service(security, "127.0.0.1")
        yield security, mpi_ids
    finally:
        stop_seat_service(security)
        running.stop_cluster_sync()


def _mpi_rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def test_mpi_ranks_are_one_seat_that_plain_seats_never_get(
    seated_mpi: tuple[Path, list[int]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    from course_lib.cluster.seat import NoSeatError, take_seat

    security, mpi_ids = seated_mpi
    client_file = security / "ipcontroller-client.json"
    monkeypatch.setenv("COURSE_CLUSTER_FILE", str(client_file))
    with start_cluster("mpi", 2) as world:  # a lecture's MPI cell, in the lab
        assert world.ids_by_rank == mpi_ids and world.run(_mpi_rank) == [0, 1]
        assert world.where().startswith("a seat of 2 MPI ranks of the room's cluster")
        with start_cluster(n=2) as plain:  # the same notebook's engines: the other two
            assert not set(plain.ids_by_rank) & set(mpi_ids)
            with pytest.raises(ClusterError, match="no free seat of 1 engines"):
                connect_cluster(connection_file=str(client_file), n=1)
        plain_ids = plain.ids_by_rank
    # Another notebook holds the world: this one is told so in one line and gets MPI ranks here.
    other = take_seat(client_file, 2, [*mpi_ids, *plain_ids], mpi=True)
    assert other is not None and other.ids == mpi_ids  # the whole world, in rank order
    try:
        with start_cluster("mpi", 2) as here:
            assert here.kind == "mpi" and here.owned is not None  # started on this PC
    finally:
        other.release()
    said = [line for line in capsys.readouterr().out.splitlines() if "held by another" in line]
    assert len(said) == 1 and "running on 2 MPI ranks on this PC instead" in said[0], said
    with pytest.raises(NoSeatError, match=r"MPI world has 2 ranks, not 3: ask for start_cluster"):
        take_seat(client_file, 3, [*mpi_ids, *plain_ids], mpi=True)
