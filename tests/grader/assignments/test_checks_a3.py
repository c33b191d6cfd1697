"""A3's checks: the instructor's answers pass on real engines, inside the kit's data-parallel
training; the stubs, source 000's published averaging, a forgotten server, a hard-coded server,
the backend's built-in allreduce and a ring that passes whole buffers fail with a verdict that
names what is wrong; the bucket layout's usual mistakes fail without engines."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from course_grader.assignments.a3.checks import (
    A3_POINTS,
    check_bucket_average,
    check_bucket_layout,
    check_parameter_server,
    ring_bytes_bounds,
)
from course_grader.assignments.a3.judge import train_and_compare
from course_grader.cells import answer_id

pytestmark = pytest.mark.timeout(600)

SOURCE = Path(__file__).resolve().parents[3] / "assignments" / "source" / "A3_data_parallel.ipynb"
ANSWERS = {
    answer_id(c): c.source for c in nbformat.read(SOURCE, as_version=4).cells if answer_id(c)
}


def _define(exercise: str, *edits: tuple[str, str]) -> object:
    """Return the source's answer to ``exercise`` (with ``edits``), defined as in the notebook."""
    code = ANSWERS[exercise]
    for old, new in edits:
        assert old in code, f"the solution of {exercise} no longer holds {old!r}"
        code = code.replace(old, new)
    namespace = {"__name__": "__main__", "np": np}
    exec(compile(code, f"A3 source {exercise}", "exec"), namespace)
    (name,) = [k for k in namespace if k not in ("__name__", "np", "__builtins__")]
    return namespace[name]


def _replaced(exercise: str, code: str) -> object:
    """Return a whole answer cell's function, defined as in the notebook."""
    namespace = {"__name__": "__main__", "np": np}
    exec(compile(code, f"A3 {exercise}", "exec"), namespace)
    (name,) = [k for k in namespace if k not in ("__name__", "np", "__builtins__")]
    return namespace[name]


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise A3.x: write your answer here")


def _verdict(check, *args) -> str:
    result = check(*args, verbose=False)
    assert result.points == (result.max_points if result.passed else 0.0)
    return f"{'PASS' if result.passed else 'FAIL'} {result.detail}"


# -- A3.2, without engines -------------------------------------------------------------------------


def test_bucket_layout_check_passes_the_source_and_names_the_usual_mistakes():
    assert _verdict(check_bucket_layout, _define("A3.2")).startswith("PASS 9 layouts")
    assert _verdict(check_bucket_layout, stub).startswith("FAIL not implemented yet: Exercise A3")
    mistakes = {
        (("reversed(range(len(sizes)))", "range(len(sizes))"),): "start from the last parameter",
        (("nbytes >= bucket_bytes", "nbytes > bucket_bytes"),): "closes as soon as it holds >=",
        (("4 * sizes[i]", "sizes[i]"),): "(4 per value)",
        (("if bucket_bytes < 1:", "if False:"),): "bucket_bytes=0 must raise ValueError",
        (("    if current:\n        buckets.append(current)\n", ""),): "exactly one bucket",
    }
    for edits, why in mistakes.items():
        got = _verdict(check_bucket_layout, _define("A3.2", *edits))
        assert got.startswith("FAIL") and why in got, (edits, got)


def test_engine_check_stubs_fail_before_any_engine_is_busy():
    class NoCluster:  # the stub must fail before the check touches the cluster's engines
        world_size = 4

    for check in (check_parameter_server, check_bucket_average):
        got = _verdict(check, stub, NoCluster())
        assert got.startswith("FAIL not implemented yet: Exercise A3.x"), got


def test_ring_bytes_bounds_hold_the_librarys_ring_exactly():
    from course_lib.comm.buffers import chunk_bounds

    for size in (1, 3, 10, 599, 1001):
        for n in (2, 3, 4, 8):
            c = [(b - a) * 4 for a, b in chunk_bounds(size, n)]
            low, high = ring_bytes_bounds(size, n)
            for r in range(n):  # rank r sends every chunk but r (scatter) and r + 1 (gather)
                assert low <= 2 * sum(c) - c[r] - c[(r + 1) % n] <= high


# -- A3.1 and A3.3 on 4 engines -----------------------------------------------------------------


SINGLE_SERVER = """
def ps_average(comm, flat, server):
    n = comm.world_size
    if comm.rank != server:
        comm.send(flat, server)
        comm.recv(flat, server)
        return flat
    incoming = np.empty_like(flat)
    for worker in range(n):
        if worker != server:
            flat += comm.recv(incoming, worker)
    flat /= n
    for worker in range(n):
        if worker != server:
            comm.send(flat, worker)
    return flat
"""


def builtin_average(comm, flat, server=0):
    """The right mean through the backend's collective: not what the exercise asks."""
    comm.allreduce(flat)
    flat /= comm.world_size
    return flat


def ring_of_whole_buffers(comm, flat):
    """Passes the whole buffer round the ring N - 1 times: the mean, at (N - 1) S bytes."""
    import numpy as np

    r, n = comm.rank, comm.world_size
    passing, incoming, total = flat.copy(), np.empty_like(flat), flat.copy()
    for _ in range(n - 1):
        comm.sendrecv(passing, (r + 1) % n, incoming, (r - 1) % n)
        total += incoming
        passing[:] = incoming
    flat[:] = total / n
    return flat


@pytest.fixture(scope="module")
def cluster(shared_engines):
    cl = shared_engines(4)  # from the session's pool (tests/conftest.py)
    cl.view.execute("import numpy as np", block=True)
    return cl


@pytest.mark.slow
def test_a3_engine_checks_pass_the_source_and_fail_built_ins_and_published_mistakes(cluster):
    solution_ps, solution_ring = _define("A3.1"), _define("A3.3")
    source000 = _define(
        "A3.1",
        (  # source 000's grad_serv_mean, as the library keeps it
            "    mean = parts[0].copy()\n    for q in range(1, n):  # rank order: the same sum "
            "whatever arrives first\n        mean += parts[q]\n    mean /= n  # once, over all N parts\n",
            "    mean = parts[r].copy()\n    for q in range(n):\n        if q != r:\n"
            "            mean /= n - 1\n            mean += parts[q] / (n - 1)\n",
        ),
    )
    assert re.match(
        r"PASS 4 ranks, shard 0 served by rank 0 and by rank 3: .* 10 training steps with shard 0 "
        r"on rank 1 .*",
        _verdict(check_parameter_server, solution_ps, cluster),
    )
    assert re.match(
        r"PASS 4 ranks, 5 sizes: .* 10 training steps in 3 overlapped buckets",
        _verdict(check_bucket_average, solution_ring, cluster),
    )
    expected = {
        (check_parameter_server, source000): r"FAIL size 1, server rank 0: rank \d holds "
        r"source 000's published combination: it divides inside the loop over the clients "
        r"and leaves the server's own gradient out.*",
        (
            check_parameter_server,
            _define("A3.1", ("mean /= n  #", "mean /= n - 1  #")),
        ): r"FAIL size 1, server rank 0: rank \d holds the sum divided by N - 1 = 3: the server "
        r"computes a gradient too, divide by N = 4",
        (
            check_parameter_server,
            _define(
                "A3.1",
                (  # the server hard-coded at rank 0
                    "def ps_average(comm, flat, server):",
                    "def ps_average(comm, flat, _):\n    server = 0",
                ),
            ),
        ): r"FAIL size 1, server rank 3: rank 0 sent \{1: 4, 2: 4, 3: 4\} and received .* "
        r"serving shard 1 .*",
        (check_parameter_server, _replaced("A3.1", SINGLE_SERVER)): r"FAIL size 10, server rank "
        r"0: rank 0 sent .*: that is one server for the whole vector, lecture 4's parameter "
        r"server \(Exercise 4.1\), .*",
        (check_parameter_server, builtin_average): r"FAIL size 1, server rank 0: rank \d uses the "
        r"built-in comm\.allreduce; write the exchange from send/recv",
        (check_bucket_average, builtin_average): r"FAIL size 1: rank \d uses the built-in "
        r"comm\.allreduce; write the exchange from send/recv",
        (
            check_bucket_average,
            _define("A3.3", ("    flat /= n\n", "")),
        ): r"FAIL size 1: rank \d holds the sum: divide it by N = 4",
        (check_bucket_average, ring_of_whole_buffers): r"FAIL size 1: rank \d sent 12 bytes;"
        r" a ring allreduce sends 2\(N-1\)/N of the buffer, 0 to 8 bytes here: .*",
    }
    for (check, fn), pattern in expected.items():
        got = _verdict(check, fn, cluster)
        assert re.fullmatch(pattern, got), (fn.__name__, got)
    # Without the probe, the training run alone catches source 000's combination: 10 steps
    # leave the replicas equal to each other but not to one process.
    with pytest.raises(AssertionError, match="agree with each other but not with one process"):
        train_and_compare(cluster, "ps", source000, server=1)
    assert sum(A3_POINTS.values()) == 10
