"""MPI ranks across the emulated room's PCs, from the hosts file: ``./kit lab mpi HOSTS -- CMD``.

Four PCs (namespaces behind shaped links), one rank each, started by MPICH's hydra over the
room's ``ssh`` stand-in. MPI's Allreduce and the from-scratch ring over the MPI communicator must
give the exact sum, and the data must cross the PCs' links: each PC's link counters must grow by
at least what a ring sends (``2 (N-1)/N`` of the buffer per allreduce), which shared memory
between the namespaces (one kernel) would not do. Deselect with ``-m "not room"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_kit.lab.hosts import read_hosts
from course_kit.lab.mpi import write_hostfile
from course_kit.room.build import emulated_room, room_unavailable_reason
from course_kit.room.ssh import write_ssh_standins

pytestmark = [pytest.mark.room, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
PCS = 4
MIB = 2.0


def _bytes_from(veth: str) -> int:
    """Return the bytes PC sent into the room through ``veth`` (its host end receives them)."""
    return int(Path(f"/sys/class/net/{veth}/statistics/rx_bytes").read_text())


def test_allreduce_across_four_pcs_is_exact_and_crosses_the_links(tmp_path: Path) -> None:
    reason = room_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")
    with emulated_room(PCS) as room:
        ssh, scp = write_ssh_standins(room, tmp_path / "bin")
        hosts_file = tmp_path / "hosts.toml"
        hosts_file.write_text(
            f'[defaults]\npython = "{sys.executable}"\n[ssh]\ncommand = ["{ssh}"]\n'
            + "".join(f'[[pc]]\nhost = "{pc.hostname}"\n' for pc in room.pcs)
        )
        before = [_bytes_from(pc.host_veth) for pc in room.pcs]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "course_kit.jobs.cluster",
                "lab",
                "mpi",
                str(hosts_file),
                "--",
                sys.executable,
                "-m",
                "course_lib.collectives.mpi_across_pcs",
                "--mib",
                str(MIB),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=ROOT,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        sent = [_bytes_from(pc.host_veth) - b for pc, b in zip(room.pcs, before, strict=True)]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("ALLREDUCE "))
    report = json.loads(line.removeprefix("ALLREDUCE "))
    assert report["ranks"] == PCS
    assert sorted(report["hosts"]) == sorted(pc.hostname for pc in room.pcs)  # a rank per PC
    assert report["max_error"] == 0.0, report  # both methods exact on every rank
    # Two allreduces (MPI's, then the ring), each sending >= 2 (N-1)/N of the buffer per rank.
    least = 2 * 2 * (PCS - 1) / PCS * MIB * 2**20
    assert min(sent) >= 0.95 * least, (sent, least)


def test_hostfile_from_the_hosts_file(tmp_path: Path) -> None:
    hosts_file = tmp_path / "hosts.toml"
    hosts_file.write_text(
        '[defaults]\npython = "/opt/venv/bin/python"\n'
        '[[pc]]\nhost = "a"\nengines = 2\n[[pc]]\nhost = "b"\nengines = 0\n'
        '[[pc]]\nhost = "10.0.0.3"\n'
    )
    hosts = read_hosts(hosts_file)
    assert write_hostfile(hosts, tmp_path / "hf").read_text() == "a:2\n10.0.0.3:1\n"
    hosts_file.write_text('[defaults]\npython = "p"\n[[pc]]\nhost = "me@a"\n')
    with pytest.raises(ValueError, match="ssh/config"):
        write_hostfile(read_hosts(hosts_file), tmp_path / "hf")
