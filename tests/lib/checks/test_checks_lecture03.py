"""Lecture 3's check on real ranks: the instructor's ring passes; the notebook's stub, the
library's ring (however it is imported) and a gather through the built-in collective fail."""

from __future__ import annotations

import pytest
from lecture03_answers import my_ring_allgather
from lecture_notebooks import notebook_function

from course_lib import collectives as C
from course_lib.checks.lecture03 import check_ring_allgather

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cluster = shared_engines(3)  # from the session's pool (tests/conftest.py)
    setup_communicators(cluster, backend="gloo", timeout=30)
    return cluster


def through_the_library(comm, buf):
    """The answer the review found: one call to the function the notebook imports."""
    from course_lib.collectives.ring import ring_allgather as ring

    return ring(comm, buf)


def through_the_builtin(comm, buf):
    """The right values, but gathered whole through the backend's collective: not a ring."""
    import numpy as np

    from course_lib.comm import chunk_bounds

    whole = comm.allgather(np.ascontiguousarray(buf))
    for q, (a, b) in enumerate(chunk_bounds(buf.size, comm.world_size)):
        buf[a:b] = whole[q][a:b]
    return buf


def test_answer_passes(cluster):
    verdict = check_ring_allgather(my_ring_allgather, cluster, verbose=False)
    assert verdict, verdict.detail


def test_stub_fails(cluster):
    stub = notebook_function("03_communication.ipynb", "my_ring_allgather")
    verdict = check_ring_allgather(stub, cluster, verbose=False)
    assert not verdict and "not implemented yet" in verdict.detail


def test_the_library_ring_is_refused_under_any_name(cluster):
    for delegate in (C.ring_allgather, through_the_library):
        verdict = check_ring_allgather(delegate, cluster, verbose=False)
        assert not verdict
        assert "course_lib.collectives.ring_allgather, which answers" in verdict.detail
        assert "comm.sendrecv" in verdict.detail
    assert check_ring_allgather(my_ring_allgather, cluster, verbose=False)  # restored


def test_a_gather_that_is_not_a_ring_fails(cluster):
    verdict = check_ring_allgather(through_the_builtin, cluster, verbose=False)
    assert not verdict and "a ring sends" in verdict.detail, verdict.detail
