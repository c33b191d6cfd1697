"""``lab mpi`` hands MPICH's ``mpiexec`` the allocation's hosts (course_kit/lab/slurm_hosts.py).

MPICH's own parser of Slurm's node list dies of SIGFPE on names such as ``lab2-pc07``: the real
``mpiexec`` is run with such an allocation's environment, alone (it dies) and through the kit's
helper (its ranks run). Slurm's own ``scontrol`` expands the list; no Slurm daemon is needed.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from course_kit.lab.mpi import lab_mpiexec
from course_kit.lab.slurm_hosts import hydra_hosts, mpiexec_with_hosts, tasks_per_node

RANK_LINE = "from mpi4py import MPI; print('RANK', MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)"


@pytest.mark.parametrize(
    ("spec", "counts"),
    [("2(x3)", [2, 2, 2]), ("3,1,1", [3, 1, 1]), ("2(x2),1", [2, 2, 1]), ("4", [4])],
)
def test_slurm_tasks_per_node_expands_to_one_count_a_node(spec: str, counts: list[int]) -> None:
    assert tasks_per_node(spec) == counts


def test_a_count_that_is_not_slurms_is_refused() -> None:
    with pytest.raises(ValueError, match="not Slurm's"):
        tasks_per_node("2(3)")


def test_hydra_hosts_names_each_node_with_its_ranks() -> None:
    assert hydra_hosts(["lab2-pc07", "lab2-pc08"], [2, 1]) == "lab2-pc07:2,lab2-pc08:1"
    with pytest.raises(ValueError, match="2 nodes but ranks given for 1"):
        hydra_hosts(["a", "b"], [2])


def test_outside_an_allocation_it_says_so_in_one_line() -> None:
    with pytest.raises(ValueError, match="inside a Slurm allocation"):
        mpiexec_with_hosts(["mpiexec", "-n", "2", "true"], {})
    done = subprocess.run(
        [sys.executable, "-m", "course_kit.lab.slurm_hosts", "mpiexec", "true"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def allocation_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a Slurm allocation (what salloc sets) on two nodes named like a lab's PCs."""
    if shutil.which("scontrol") is None:
        pytest.skip("no Slurm client (scontrol) here: apt-get install slurm-client")
    conf = tmp_path / "slurm.conf"  # scontrol reads one; expanding names asks no daemon
    conf.write_text("ClusterName=probe\nSlurmctldHost=localhost\n")
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "SLURM_CONF": str(conf),
        **{name: "9" for name in ("SLURM_JOB_ID", "SLURM_JOBID")},
        **{name: "lab2-pc07,lab2-pc08" for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST")},
        **{name: "2" for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")},
        **{name: "2,1" for name in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE")},
        "UCX_TLS": "tcp",
    }


def test_mpiexec_alone_dies_on_such_names_and_runs_through_the_helper(
    allocation_env: dict[str, str],
) -> None:
    # The fork launcher starts hydra's proxies here: no Slurm daemon, the same node-list parsing.
    mpiexec = [str(lab_mpiexec()), "-launcher", "fork", "-n", "3", sys.executable, "-c", RANK_LINE]
    alone = subprocess.run(mpiexec, env=allocation_env, capture_output=True, text=True, timeout=60)
    assert alone.returncode == -signal.SIGFPE, (alone.returncode, alone.stderr)
    helped = subprocess.run(
        [sys.executable, "-m", "course_kit.lab.slurm_hosts", *mpiexec],
        env=allocation_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert helped.returncode == 0, helped.stdout + helped.stderr
    ranks = sorted(line for line in helped.stdout.splitlines() if line.startswith("RANK "))
    assert ranks == ["RANK 0 3", "RANK 1 3", "RANK 2 3"], helped.stdout
    assert mpiexec_with_hosts(mpiexec, allocation_env)[1:3] == ["-hosts", "lab2-pc07:2,lab2-pc08:1"]
