"""MPI engines on this PC from a notebook that runs inside a Slurm job (course_lib/cluster/mpi_here.py).

The notebook's environment is a Slurm allocation's on two nodes named like a lab's PCs
(``lab2-pc07``): MPICH's ``mpiexec`` left to read it dies of SIGFPE, and start_cluster says so;
told the ranks are this PC's, the real engines start and form one MPI world. No Slurm daemon.
"""

from __future__ import annotations

import pytest
from comm_workers.launch import mpiexec

import course_lib.cluster.launch as launch_module
from course_lib.cluster import ClusterError, start_cluster
from course_lib.cluster.mpi_here import HERE_OPTIONS, in_slurm_allocation, mpiexec_here

pytestmark = [pytest.mark.mpi, pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")]

ALLOCATION = {
    **{name: "9" for name in ("SLURM_JOB_ID", "SLURM_JOBID")},
    **{name: "lab2-pc07,lab2-pc08" for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST")},
    **{name: "2" for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")},
    **{name: "2,1" for name in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE")},
}


def _world() -> tuple[int, int]:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def test_outside_slurm_mpiexec_runs_as_it_is() -> None:
    assert not in_slurm_allocation({})
    assert mpiexec_here("/any/mpiexec", {}) == ["/any/mpiexec"]


def test_in_a_slurm_job_mpi_engines_start_on_this_pc(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ALLOCATION.items():
        monkeypatch.setenv(name, value)
    assert mpiexec_here(str(mpiexec()))[1:] == list(HERE_OPTIONS)
    with start_cluster(n=2, kind="mpi", timeout=60) as cluster:
        worlds = cluster.view.apply_sync(_world)
    assert sorted(worlds) == [(0, 2), (1, 2)], worlds


def test_left_to_read_slurms_names_mpiexec_dies_and_the_error_says_how(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in ALLOCATION.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch_module, "mpiexec_here", lambda mpiexec: [mpiexec])  # as before
    with pytest.raises(ClusterError) as raised:
        start_cluster(n=2, kind="mpi", timeout=60)
    said = str(raised.value).splitlines()[0]
    assert said == "2 mpi engines ended while starting: mpiexec ended on signal SIGFPE.", said
