"""Lecture 9's checks on real ranks: the instructor's answers pass; the notebook's stubs and
answers that call the library's operators (gather_from_parallel, reduce_from_parallel,
scatter_batch_grad) fail, the refusal naming the operator."""

from __future__ import annotations

import pytest
from lecture09_answers import my_column_parallel, my_features_grad, my_row_parallel
from lecture_notebooks import notebook_function

from course_lib.checks.lecture09 import (
    check_column_parallel,
    check_features_grad,
    check_row_parallel,
)

pytestmark = pytest.mark.timeout(300)
NOTEBOOK = "09_model_parallel.ipynb"


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cluster = shared_engines(2)  # from the session's pool (tests/conftest.py)
    setup_communicators(cluster, backend="gloo", timeout=60)
    return cluster


def library_column(comm, X, W_shard):
    from course_lib.parallel.model_parallel.tensor_parallel import (
        gather_from_parallel,
        shard_bounds,
    )

    bounds = shard_bounds(W_shard.shape[0] * comm.world_size, comm.world_size)
    return gather_from_parallel(X @ W_shard.T, comm, bounds)


def library_row(comm, X_shard, W_shard):
    from course_lib.parallel.model_parallel.tensor_parallel import reduce_from_parallel

    return reduce_from_parallel(X_shard @ W_shard.T, comm)


def library_features_grad(comm, grad_whole):
    from course_lib.parallel.model_parallel.hybrid import scatter_batch_grad

    return scatter_batch_grad(comm, grad_whole)


EXERCISES = [
    (check_column_parallel, my_column_parallel, "my_column_parallel", library_column,
     "tensor_parallel.gather_from_parallel"),
    (check_row_parallel, my_row_parallel, "my_row_parallel", library_row,
     "tensor_parallel.reduce_from_parallel"),
    (check_features_grad, my_features_grad, "my_features_grad", library_features_grad,
     "hybrid.scatter_batch_grad"),
]  # fmt: skip


@pytest.mark.parametrize("check, answer, name, delegate, callee", EXERCISES)
def test_answer_passes_stub_and_library_fail(cluster, check, answer, name, delegate, callee):
    verdict = check(answer, cluster, verbose=False)
    assert verdict, verdict.detail
    stub = check(notebook_function(NOTEBOOK, name), cluster, verbose=False)
    assert not stub and "not implemented" in stub.detail, stub.detail
    library = check(delegate, cluster, verbose=False)
    assert not library and f"calls course_lib.parallel.model_parallel.{callee}" in library.detail
    assert check(answer, cluster, verbose=False)  # the engines' library is restored
