"""Lecture 4's checks on real engines: the reference answers pass, the stubs, source 000's
averaging, a built-in collective and a wrong formula fail, and a check never raises."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.checks.lecture04 import (
    check_parameter_server,
    check_sync_time,
    reference_ps_average,
    reference_sync_time,
    source000_ps_average,
    stub_ps_average,
    stub_sync_time,
)
from course_lib.cost_model.alpha_beta import LinkModel
from course_lib.parallel.data_parallel.prediction import predict_step

pytestmark = pytest.mark.timeout(600)


def allreduce_average(comm, flat):
    """The right mean, but through the backend's collective: not a parameter server."""
    comm.allreduce(flat)
    flat /= comm.world_size


def server_only_mean(comm, flat):
    """Divides by the number of workers, leaving the server's own gradient out of the count."""
    import numpy as np

    if comm.rank:
        comm.send(flat, 0)
        comm.recv(flat, 0)
        return
    for worker in range(1, comm.world_size):
        flat += comm.recv(np.empty_like(flat), worker)
    flat /= comm.world_size - 1
    for worker in range(1, comm.world_size):
        comm.send(flat, worker)


@pytest.fixture(scope="module")
def cluster(shared_engines):
    return shared_engines(3)  # from the session's pool (tests/conftest.py)


def test_parameter_server_check_passes_the_reference_and_fails_wrong_answers(cluster):
    passed = check_parameter_server(reference_ps_average, cluster, verbose=False)
    assert passed, passed.detail
    assert "3 engines" in passed.detail
    stub = check_parameter_server(stub_ps_average, cluster, verbose=False)
    assert not stub and "not implemented yet" in stub.detail
    source000 = check_parameter_server(source000_ps_average, cluster, verbose=False)
    assert not source000 and "differ from one process" in source000.detail, source000.detail
    wrong_count = check_parameter_server(server_only_mean, cluster, verbose=False)
    assert not wrong_count and "differ from one process" in wrong_count.detail
    builtin = check_parameter_server(allreduce_average, cluster, verbose=False)
    assert not builtin and "built-in collective" in builtin.detail, builtin.detail
    assert str(builtin).startswith("Exercise 4.1 parameter server: FAIL (")
    again = check_parameter_server(reference_ps_average, cluster, world_size=2, verbose=False)
    assert again, again.detail  # a failed run leaves the engines usable


def test_sync_time_check_passes_the_cost_model_and_fails_wrong_formulas():
    assert check_sync_time(reference_sync_time, verbose=False)
    assert not check_sync_time(stub_sync_time, verbose=False)

    def one_way(method, nbytes, world_size, alpha, beta):  # forgets the way back
        return reference_sync_time(method, nbytes, world_size, alpha, beta) / 2

    def ring_for_both(method, nbytes, world_size, alpha, beta):
        return reference_sync_time("ring", nbytes, world_size, alpha, beta)

    for wrong in (one_way, ring_for_both):
        verdict = check_sync_time(wrong, verbose=False)
        assert not verdict and "alpha-beta model gives" in verdict.detail


def test_predicted_step_splits_compute_and_exchange():
    link = LinkModel(alpha=50e-6, beta=1 / 125e6)
    one = predict_step(
        "ring", nbytes=8e6, world_size=1, global_batch=64, compute_per_sample=1e-3, link=link
    )
    assert one.exchange_s == 0 and one.speedup == 1.0
    four = predict_step(
        "parameter_server",
        nbytes=8e6,
        world_size=4,
        global_batch=64,
        compute_per_sample=1e-3,
        link=link,
    )
    assert np.isclose(four.compute_s, 16e-3)
    assert np.isclose(four.exchange_s, 2 * 3 * (50e-6 + 8e6 / 125e6))
    assert np.isclose(four.speedup, 64e-3 / (16e-3 + four.exchange_s))
    with pytest.raises(ValueError, match="every rank needs at least one sample"):
        predict_step(
            "ring", nbytes=1, world_size=8, global_batch=4, compute_per_sample=0, link=link
        )
    with pytest.raises(ValueError, match="choose one of parameter_server"):
        predict_step(
            "star", nbytes=1, world_size=2, global_batch=4, compute_per_sample=0, link=link
        )
