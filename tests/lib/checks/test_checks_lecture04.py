"""Lecture 4's checks on real engines: the instructor's answers pass; the notebook's stubs,
source 000's averaging, a built-in collective, the library's server and cost model, and wrong
formulas fail, and a check never raises."""

from __future__ import annotations

import numpy as np
import pytest
from lecture04_answers import my_ps_average, my_sync_time
from lecture_notebooks import notebook_function

from course_lib.checks.lecture04 import (
    check_parameter_server,
    check_sync_time,
)
from course_lib.cost_model.alpha_beta import ALGORITHMS, LinkModel, predict
from course_lib.parallel.data_parallel.prediction import predict_step

pytestmark = pytest.mark.timeout(600)


def allreduce_average(comm, flat):
    """The right mean, but through the backend's collective: not a parameter server."""
    comm.allreduce(flat)
    flat /= comm.world_size


def source000_ps_average(comm, flat):
    """A server written out, combining as source 000's published code does: must FAIL."""
    import numpy as np

    from course_lib.parallel.exchanges.parameter_server import ParameterServerSource000

    if comm.rank:
        comm.send(flat, 0)
        comm.recv(flat, 0)
        return
    grads = [comm.recv(np.empty_like(flat), worker) for worker in range(1, comm.world_size)]
    ParameterServerSource000().combine_in_place(flat, grads)
    for worker in range(1, comm.world_size):
        comm.send(flat, worker)


def library_server(comm, flat):
    """One call to the library's parameter server, which the lecture imports."""
    from course_lib.parallel.exchanges.parameter_server import ParameterServer

    ParameterServer().average(comm, flat)


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
    passed = check_parameter_server(my_ps_average, cluster, verbose=False)
    assert passed, passed.detail
    assert "3 engines" in passed.detail
    stub = notebook_function("04_data_parallel.ipynb", "my_ps_average")
    stub = check_parameter_server(stub, cluster, verbose=False)
    assert not stub and "not implemented yet" in stub.detail, stub.detail
    library = check_parameter_server(library_server, cluster, verbose=False)
    assert not library and "calls course_lib.parallel.exchanges.parameter_server." in library.detail
    assert "ParameterServer.average, which answers the exercise" in library.detail, library.detail
    source000 = check_parameter_server(source000_ps_average, cluster, verbose=False)
    assert not source000 and "differ from one process" in source000.detail, source000.detail
    wrong_count = check_parameter_server(server_only_mean, cluster, verbose=False)
    assert not wrong_count and "differ from one process" in wrong_count.detail
    builtin = check_parameter_server(allreduce_average, cluster, verbose=False)
    assert not builtin and "built-in collective" in builtin.detail, builtin.detail
    assert str(builtin).startswith("Exercise 4.1 parameter server: FAIL (")
    again = check_parameter_server(my_ps_average, cluster, world_size=2, verbose=False)
    assert again, again.detail  # a failed run leaves the engines usable


def test_sync_time_check_passes_the_answer_and_fails_wrong_formulas():
    assert check_sync_time(my_sync_time, verbose=False)
    stub = check_sync_time(notebook_function("04_data_parallel.ipynb", "my_sync_time"))
    assert not stub and "not implemented yet" in stub.detail

    def one_way(method, nbytes, world_size, alpha, beta):  # forgets the way back
        return my_sync_time(method, nbytes, world_size, alpha, beta) / 2

    def ring_for_both(method, nbytes, world_size, alpha, beta):
        return my_sync_time("ring", nbytes, world_size, alpha, beta)

    for wrong in (one_way, ring_for_both):
        verdict = check_sync_time(wrong, verbose=False)
        assert not verdict and "alpha-beta model gives" in verdict.detail


def test_sync_time_check_refuses_the_cost_model():
    def through_predict(method, nbytes, world_size, alpha, beta):  # the review's one call
        name = "star_allreduce" if method == "parameter_server" else "ring_allreduce"
        return predict(name, nbytes, world_size, LinkModel(alpha, beta))

    def through_the_table(method, nbytes, world_size, alpha, beta):
        name = "star_allreduce" if method == "parameter_server" else "ring_allreduce"
        return ALGORITHMS[name](nbytes, world_size, alpha, beta)

    for delegate, callee in ((through_predict, "alpha_beta.predict"),
                             (through_the_table, "alpha_beta.ALGORITHMS[star_allreduce]")):  # fmt: skip
        verdict = check_sync_time(delegate, verbose=False)
        assert not verdict and f"calls course_lib.cost_model.{callee}" in verdict.detail, verdict
    assert predict("ring_allreduce", 8, 2, LinkModel(1.0, 1.0)) == 10.0  # restored afterwards


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
