"""A4's checks on real engines: the instructor's answers pass; stubs, the library's symmetric gossip
and the tempting wrong answers (plain mean, two allreduces, averaging gradients or before the step,
averaging at the wrong steps, a rotation that rounds P/2 up) fail with the verdict that says why;
and the grader gives a transcription of the library and an in-kernel route to a verdict none."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from course_grader.assignments.a4.checks import (
    A4_POINTS,
    MISTAKES,
    check_directed_gossip,
    check_local_sgd,
    check_weighted_average,
    directed_distances,
    directed_gossip_matrix,
    local_sgd_shards,
    simulate_local_sgd_numpy,
)
from course_grader.cells import answer_id
from course_grader.grade import GradingLimits, grade_notebook
from course_lib.collectives.mixing import allreduce_matrix, is_doubly_stochastic

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "assignments" / "source" / "A4_local_sgd_gossip.ipynb"
RELEASED = ROOT / "notebooks" / "assignments" / "A4_local_sgd_gossip.ipynb"
LIMITS = GradingLimits(cell_seconds=45, total_seconds=300)

# The source notebook's answers, run as they are (so the tests grade what students are shown).
for _cell in nbformat.read(SOURCE, as_version=4).cells:
    if answer_id(_cell):
        exec(compile(_cell.source, f"A4 source {answer_id(_cell)}", "exec"))


# -- the references, without engines ---------------------------------------------------------


@pytest.mark.parametrize("world_size", range(2, 9))
def test_directed_distances_rotate_one_to_half_p_and_each_matrix_keeps_the_mean(world_size):
    distances = directed_distances(world_size, 2 * world_size)
    top = world_size // 2
    assert distances[: 2 * top] == list(range(1, top + 1)) * 2
    for s in set(distances):
        w = directed_gossip_matrix(world_size, s)
        assert is_doubly_stochastic(w) and (np.count_nonzero(w, axis=1) == 2).all()
        assert w[0, (-s) % world_size] == 0.5  # rank 0 hears from rank -s, not from +s


def test_two_directed_steps_on_four_ranks_give_the_exact_mean():
    product = directed_gossip_matrix(4, 2) @ directed_gossip_matrix(4, 1)
    assert np.allclose(product, allreduce_matrix(4))


def test_local_sgd_1_is_gradient_descent_on_all_data_and_the_mistakes_differ_at_p_3():
    shards = local_sgd_shards(4)
    X, y = np.concatenate([s[0] for s in shards]), np.concatenate([s[1] for s in shards])
    w = np.zeros(X.shape[1])
    for _ in range(5):
        w = w - 0.1 * X.T @ (X @ w - y) / len(y)
    replicas = simulate_local_sgd_numpy(shards, np.zeros(X.shape[1]), 0.1, 1, 5)
    assert np.allclose(replicas, w, rtol=1e-12, atol=1e-12)
    right = simulate_local_sgd_numpy(shards, np.zeros(X.shape[1]), 0.1, 3, 10)
    for variant in MISTAKES:
        wrong = simulate_local_sgd_numpy(shards, np.zeros(X.shape[1]), 0.1, 3, 10, variant)
        assert np.abs(wrong - right).max() > 1e-3, variant  # each mistake is told apart


# -- the checks on engines -------------------------------------------------------------------


def stub(*args):
    raise NotImplementedError("Exercise A4.x: write your answer here")


def plain_mean(comm, w, n):
    """Ignores the shard sizes."""
    buf = np.append(w, 1).astype(w.dtype)
    buf = comm.allreduce(buf)
    w[:] = buf[:-1] / comm.world_size
    return w


def two_allreduces(comm, w, n):
    """Right numbers, two latencies."""
    total = comm.allreduce(np.array([n], dtype=w.dtype))
    w *= n
    w[:] = comm.allreduce(w) / total[0]
    return w


def averages_gradients(comm, w, X, y, lr, period, num_steps):
    for k in range(num_steps):
        grad = X.T @ (X @ w - y) / len(y)
        if (k + 1) % period == 0:
            grad = weighted_average(comm, grad, len(y))  # noqa: F821 - the source's answer
        w = w - lr * grad
    return w


def averages_before_the_step(comm, w, X, y, lr, period, num_steps):
    """Source 001's Algorithm 1 as written: gradient at the local weights, average, step."""
    for k in range(num_steps):
        grad = X.T @ (X @ w - y) / len(y)
        if (k + 1) % period == 0:
            w = weighted_average(comm, w, len(y))  # noqa: F821 - the source's answer
        w = w - lr * grad
    return w


def averages_at_the_wrong_steps(comm, w, X, y, lr, period, num_steps):
    for k in range(num_steps):
        w = w - lr * X.T @ (X @ w - y) / len(y)
        if k % period == 0:
            w = weighted_average(comm, w, len(y))  # noqa: F821 - the source's answer
    return w


def library_symmetric_gossip(comm, x, num_steps):
    """The library's gossip step (two partners, weights 1/3) with the same rotation."""
    from course_lib.collectives.gossip import gossip_step, next_distance

    s = 1
    for _ in range(num_steps):
        gossip_step(comm, x, s)
        s = next_distance(s, comm.world_size)
    return x


def rotation_rounds_up(comm, x, num_steps):
    """s = 1 .. ceil(P/2): right on 4 ranks, on 3 it talks to r + 2 as well."""
    r, p = comm.rank, comm.world_size
    incoming = np.empty_like(x)
    for k in range(num_steps):
        s = k % ((p + 1) // 2) + 1
        comm.sendrecv(x, (r + s) % p, incoming, (r - s) % p)
        x += incoming
        x /= 2
    return x


def never_rotates(comm, x, num_steps):
    r, p = comm.rank, comm.world_size
    incoming = np.empty_like(x)
    for _ in range(num_steps):
        comm.sendrecv(x, (r + 1) % p, incoming, (r - 1) % p)
        x += incoming
        x /= 2
    return x


@pytest.fixture(scope="module")
def cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cl = shared_engines(4)  # from the session's pool (tests/conftest.py)
    setup_communicators(cl, backend="gloo", timeout=20)
    cl.view.execute("import numpy as np", block=True)
    return cl


@pytest.mark.slow
def test_a4_checks_pass_the_source_and_fail_stubs_the_library_and_the_usual_mistakes(cluster):
    def verdict(check, fn) -> str:
        result = check(fn, cluster, verbose=False)
        assert result.points == (result.max_points if result.passed else 0.0)
        return f"{'PASS' if result.passed else 'FAIL'} {result.detail}"

    checks = [
        (check_weighted_average, weighted_average),  # noqa: F821 - the source's answers
        (check_local_sgd, local_sgd),  # noqa: F821
        (check_directed_gossip, directed_gossip),  # noqa: F821
    ]
    for check, fn in checks:
        assert re.match(r"PASS (4 ranks|P = 4 and 3)", verdict(check, fn)), fn
        assert verdict(check, stub).startswith("FAIL not implemented yet: Exercise A4.x")
    expected = {
        (check_weighted_average, plain_mean): r"FAIL size 1 \(float32\): the result on rank \d "
        r"is wrong \(that is the plain mean; weight each rank's w by its n\)",
        (check_weighted_average, two_allreduces): r"FAIL size 1 \(float32\): rank \d called "
        r"\{'allreduce': \(2, 8\)\}; average with one comm.allreduce of w.size \+ 1 = 2 .*",
        (check_local_sgd, averages_gradients): r"FAIL Local-SGD\(3\), 10 steps: rank \d's "
        r"weights match averaging the gradients every p steps: Local-SGD averages the weights",
        (check_local_sgd, averages_before_the_step): r"FAIL Local-SGD\(1\), 4 steps: rank \d's "
        r"weights match averaging before the step \(source 001's Algorithm 1 as written\).*",
        (check_local_sgd, averages_at_the_wrong_steps): r"FAIL Local-SGD\(3\), 10 steps: rank "
        r"\d called \{'allreduce': \(4, 192\)\}; it averages after steps 3, 6, \.\.\.: 3 .*",
        (check_directed_gossip, library_symmetric_gossip): r"FAIL P = 4, 5 steps, s = "
        r"\[1, 2, 1, 2, 1\]: rank 0 sent to ranks \[1, 2, 3\] and received from \[1, 2, 3\]; "
        r"on the directed ring it sends only to \(r \+ s\) mod P = \[1, 2\] and receives only "
        r"from \(r - s\) mod P = \[2, 3\]",
        (check_directed_gossip, rotation_rounds_up): r"FAIL P = 3, 4 steps, s = \[1, 1, 1, 1\]: "
        r"rank 0 sent to ranks \[1, 2\] and received from \[1, 2\]; .* = \[1\] and .* = \[2\]",
        (check_directed_gossip, never_rotates): r"FAIL P = 4, 5 steps, s = \[1, 2, 1, 2, 1\]: "
        r"rank 0 sent to ranks \[1\] and received from \[3\]; .*",
    }
    for (check, fn), pattern in expected.items():
        got = verdict(check, fn)
        assert re.fullmatch(pattern, got), (fn.__name__, got)


# -- grading (a kernel and engines) --------------------------------------------------------------

# The library's symmetric gossip (course_lib.collectives.gossip_step) transcribed into the answer
# cell under the assignment's name: the rotating distance is right, the partners are not.
SYMMETRIC_TRANSCRIPTION = """
def directed_gossip(comm, x, num_steps):
    r, p = comm.rank, comm.world_size
    s = 1
    for _ in range(num_steps):
        left, right = (r - s) % p, (r + s) % p
        from_left, from_right = np.empty_like(x), np.empty_like(x)
        comm.sendrecv(x, right, from_left, left)
        if left == right:
            from_right = from_left
        else:
            comm.sendrecv(x, left, from_right, right)
        x += from_left
        x += from_right
        x /= 3
        s = 1 if s + 1 > p / 2 else s + 1
    return x
"""


# A4.1: the plain mean (wrong), and Verdict.__str__ rebound to print A4.1's PASS line; A4.2 keeps
# the source's Local-SGD with a right average of its own, so that it does not lean on A4.1.
A4_ATTACK = (
    "import pkgutil\ntry:\n    V = pkgutil.resolve_name('course_lib.checks.verdict:Verdict')\n"
    "    _str = V.__str__\n"
    "    V.__str__ = lambda self: {pass_line!r} if self.exercise == 'A4.1' else _str(self)\n"
    "except Exception:\n    pass\n"
    "def weighted_average(comm, w, n):\n    return comm.allreduce(w) / comm.world_size\n"
)
A4_OWN_LOCAL_SGD = """
def local_sgd(comm, w, X, y, lr, period, num_steps):
    def average(w, n):
        buf = np.empty(w.size + 1, dtype=w.dtype)
        buf[:-1] = w * n
        buf[-1] = n
        buf = comm.allreduce(buf)
        return buf[:-1] / buf[-1]

    for k in range(num_steps):
        w = w - lr * (X.T @ (X @ w - y) / len(y))
        if (k + 1) % period == 0:
            w = average(w, len(y))
    return w
"""


@pytest.mark.slow
def test_grader_gives_a_transcription_and_a_rebound_verdict_nothing_and_an_own_answer_its_points():
    # One run: A4.1's in-kernel route to its verdict (the route that won its points when the
    # kernel decided, test_grading_attacks.WON_IN_THE_KERNEL), A4.2's own right Local-SGD, A4.3
    # the library's symmetric gossip. Each wrong answer costs only its exercise, with its reason.
    from course_grader.cells import check_id
    from course_grader.verdict.guard import rejected_answers

    source = nbformat.read(SOURCE, as_version=4)
    pass_line = next(c.outputs[0]["text"].strip() for c in source.cells if check_id(c) == "A4.1")
    attack = A4_ATTACK.format(pass_line=pass_line)
    answers = {"A4.1": attack, "A4.2": A4_OWN_LOCAL_SGD, "A4.3": SYMMETRIC_TRANSCRIPTION}
    assert not rejected_answers(source, answers)  # past the guard
    submission = copy.deepcopy(source)
    for cell in submission.cells:
        if answer_id(cell) in answers:
            cell.source = answers[answer_id(cell)]
    rows = grade_notebook("mixed", "A4", source, submission, LIMITS)
    got = {row.exercise: (row.points, row.reason) for row in rows}
    assert {ex: p for ex, (p, _) in got.items()} == dict(A4_POINTS, **{"A4.1": 0.0, "A4.3": 0.0})
    assert got["A4.2"] == (3.0, "PASS"), got
    assert got["A4.1"] == (
        0.0,
        "FAIL (size 1 (float32): the result on rank 0 is wrong "
        "(that is the plain mean; weight each rank's w by its n))",
    ), got
    assert got["A4.3"][0] == 0.0, got
    assert re.match(r"FAIL \(P = 4, 5 steps, .*: rank 0 sent to ranks \[1, 2, 3\]", got["A4.3"][1])
