"""A2 graded end to end on real engines, and its checks on engines without notebooks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from grading_notebooks import (
    A2_FULL,
    LIMITS,
    ROOM_SETTINGS,
)
from grading_notebooks import (
    points_of as _points,
)
from grading_notebooks import (
    released_notebook as _released,
)
from grading_notebooks import (
    source_notebook as _source,
)
from grading_notebooks import (
    with_answer as _with_answer,
)

from course_grader.assignments.a2.checks import (
    check_allgather_doubling,
    check_rabenseifner_allreduce,
    check_reduce_scatter_halving,
)
from course_grader.assignments.a2.judge import rabenseifner_bytes_sent, rabenseifner_partners
from course_grader.cells import answer_id
from course_grader.grade import grade_notebook
from course_lib import collectives as C
from course_lib.comm import chunk_bounds

# -- grading A2 (real engines) ---------------------------------------------------------------------

# The library's ring (course_lib.collectives.ring), transcribed into the answer cells under the
# assignment's names: right numbers and, for lengths divisible by N, the same bytes per rank as
# Rabenseifner's algorithm, but it talks to r +- 1, not r XOR 2^k.
RING_TRANSCRIPTION = {
    "A2.1": """
def reduce_scatter_halving(comm, x):
    r, p = comm.rank, comm.world_size
    bounds = chunk_bounds(len(x), p)
    for s in range(1, p):
        (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
        incoming = np.empty(d - c, dtype=x.dtype)
        comm.sendrecv(x[a:b], (r + 1) % p, incoming, (r - 1) % p)
        x[c:d] += incoming
    return x
""",
    "A2.2": """
def allgather_doubling(comm, x):
    r, p = comm.rank, comm.world_size
    bounds = chunk_bounds(len(x), p)
    for s in range(p, 2 * p - 1):
        (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
        comm.sendrecv(x[a:b], (r + 1) % p, x[c:d], (r - 1) % p)
    return x
""",
}
# The source's A2.1 without its power-of-two check (the check is the first statement after the
# names).
NO_VALUE_ERROR = re.sub(
    r"\n    if p & \(p - 1\):\n        raise ValueError\([^\n]*\)",
    "",
    next(c.source for c in _source("A2_rabenseifner_allreduce").cells if answer_id(c) == "A2.1"),
)
# A2.3's usual mistakes on 3 ranks, each right on 4 (so only A2.3 is lost): the source's answer
# with the folded buffer never added, or the result never sent back; and a ring when N is not 2^k.
_A2_3 = next(c.source for c in _source("A2_rabenseifner_allreduce").cells if answer_id(c) == "A2.3")
FOLD_NOT_ADDED = _A2_3.replace("        x += incoming\n", "")
NOT_SENT_BACK = _A2_3.replace("        comm.recv(x, r + 1)\n", "").replace(
    "    if r < 2 * extra:\n        comm.send(x, r - 1)\n", ""
)
RING_ON_3 = """
def rabenseifner_allreduce(comm, x):
    r, p = comm.rank, comm.world_size
    if p & (p - 1) == 0:
        return allgather_doubling(comm, reduce_scatter_halving(comm, x))
    bounds = chunk_bounds(len(x), p)  # not a power of two: the ring of lecture 3
    for s in range(1, p):
        (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
        incoming = np.empty(d - c, dtype=x.dtype)
        comm.sendrecv(x[a:b], (r + 1) % p, incoming, (r - 1) % p)
        x[c:d] += incoming
    for s in range(p, 2 * p - 1):
        (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
        comm.sendrecv(x[a:b], (r + 1) % p, x[c:d], (r - 1) % p)
    return x
"""
FOLD_REASONS = {
    "not_added": (
        FOLD_NOT_ADDED,
        "on 3 ranks the result on rank 0 misses the buffers of ranks [0]: each odd rank must add "
        "its even partner's buffer before the halving",
    ),
    "not_sent_back": (
        NOT_SENT_BACK,
        "on 3 ranks rank 0 returned its own input; it sat out, so its partner rank 1 must send it "
        "the result at the end",
    ),
    "ring_on_3": (
        RING_ON_3,
        "on 3 ranks rank 0 sent to ranks [1] and received from [2]; with MPICH's folding its "
        "partners are [1] (fold first: with N' = 2, ranks [0] send their buffer to the next odd "
        "rank and sit out, the other 2 run halving and doubling on comm.subgroup(...))",
    ),
}
NO_VALUE_ERROR_REASON = (
    "on 3 ranks (not a power of two) rank 0 returned; raise ValueError when comm.world_size is "
    "not a power of two, before any message"
)
RING_REASON = (
    r"FAIL \(rank 0 sent to ranks \[1\] and received from \[3\]; "
    r"its partners are r XOR 2\^k = \[1, 2\], exchange with each one both ways\)"
)


@pytest.mark.slow
def test_a2_stub_fails_and_ring_transcription_fails_on_partners(monkeypatch):
    # Graded by a grader working in the lab: A2's start_cluster(n=4) still gets local engines.
    for name, value in ROOM_SETTINGS.items():
        monkeypatch.setenv(name, value)
    # (The source's own answers get full marks in test_grading_attacks.py's A2 class, graded
    # with them: its honest student.)
    source = _source("A2_rabenseifner_allreduce")
    rows = grade_notebook("blank", "A2", source, _released("A2_rabenseifner_allreduce"), LIMITS)
    assert _points(rows) == dict.fromkeys(A2_FULL, 0.0)
    submission = source  # A2.3 stays the source's: halving then doubling, here the ring's two
    for exercise, code in RING_TRANSCRIPTION.items():
        submission = _with_answer(submission, exercise, code)
    rows = grade_notebook("ring", "A2", source, submission, LIMITS)
    assert _points(rows) == dict.fromkeys(A2_FULL, 0.0), rows
    for row in rows:
        assert re.fullmatch(RING_REASON, row.reason), row.reason
    # A2.3's usual mistakes on 3 ranks: only A2.3 is lost, with a reason that names the mistake.
    # The first beside A2.1 without its ValueError: right on 4 ranks, so only A2.1 is lost with
    # it (A2.3 calls it on 4), each with its own reason.
    for i, (name, (code, reason)) in enumerate(FOLD_REASONS.items()):
        submission = _with_answer(source, "A2.3", code)
        lost = {"A2.3": 0.0}
        if i == 0:
            submission, lost = (
                _with_answer(submission, "A2.1", NO_VALUE_ERROR),
                {**lost, "A2.1": 0.0},
            )
        rows = grade_notebook(name, "A2", source, submission, LIMITS)
        assert _points(rows) == dict(A2_FULL, **lost), (name, rows)
        assert rows[2].reason == f"FAIL ({reason})", (name, rows[2].reason)
        if i == 0:
            assert rows[0].reason == f"FAIL ({NO_VALUE_ERROR_REASON})", rows[0].reason


# -- the A2 checks on engines, without notebooks --------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("size", [1, 10, 1001, 4096])
def test_rabenseifner_bytes_are_the_ring_volume_over_partners_r_xor_2k(size, world_size):
    itemsize = 4
    nbytes = [(b - a) * itemsize for a, b in chunk_bounds(size, world_size)]
    for rank in range(world_size):
        partners = rabenseifner_partners(rank, world_size)
        assert sorted(rank ^ p for p in partners) == [2**k for k in range(len(partners))]
        assert 2 ** len(partners) == world_size
        scatter = rabenseifner_bytes_sent("reduce_scatter", size, itemsize, rank, world_size)
        gather = rabenseifner_bytes_sent("allgather", size, itemsize, rank, world_size)
        both = rabenseifner_bytes_sent("allreduce", size, itemsize, rank, world_size)
        assert both == {p: scatter[p] + gather[p] for p in partners}
        # The halves sent while halving are disjoint and cover every chunk but the rank's own.
        assert sum(scatter.values()) == sum(nbytes) - nbytes[rank]
        if size % world_size == 0:  # then the volume is the ring's, (N - 1) / N per phase
            assert sum(gather.values()) == sum(scatter.values())
            assert sum(both.values()) == 2 * (world_size - 1) * size * itemsize // world_size


# The source notebook's answers, run as they are (so the tests grade what students are shown).
for _cell in _source("A2_rabenseifner_allreduce").cells:
    if answer_id(_cell):
        exec(compile(_cell.source, f"A2 source {answer_id(_cell)}", "exec"))


def builtin_reduce_scatter(comm, x):
    """Right chunk, from the backend's reduce-scatter."""
    from course_lib.comm import chunk_bounds

    lo, hi = chunk_bounds(len(x), comm.world_size)[comm.rank]
    x[lo:hi] = comm.reduce_scatter(x)
    return x


def builtin_allreduce(comm, x):
    return comm.allreduce(x)


def doubling_whole_buffers(comm, x):
    """Right numbers and right partners, but whole buffers: log2(N) buffers, not 2(N - 1)/N."""
    from course_lib.collectives import recursive_doubling_allreduce

    return recursive_doubling_allreduce(comm, x)


def forgets_a_rank(comm, x):
    if comm.rank == 0:
        x = np.zeros_like(x)  # rank 0's contribution is forgotten
    return rabenseifner_allreduce(comm, x)  # noqa: F821 - defined by the source's answer


def careful_allreduce(comm, x):
    """The answer after a barrier: a barrier moves no data, so it is allowed."""
    comm.barrier()
    return rabenseifner_allreduce(comm, x)  # noqa: F821 - defined by the source's answer


@pytest.fixture(scope="module")
def ring_cluster(shared_engines):
    from course_lib.comm import setup_communicators

    cluster = shared_engines(4)  # from the session's pool (tests/conftest.py)
    setup_communicators(cluster, backend="gloo", timeout=10)
    cluster.view.execute("import numpy as np; from course_lib.comm import chunk_bounds")
    return cluster


@pytest.mark.slow
def test_a2_checks_pass_rabenseifner_and_fail_the_ring_built_ins_and_whole_buffers(ring_cluster):
    def verdict(check, fn) -> str:
        result = check(fn, ring_cluster, verbose=False)
        return f"{'PASS' if result.passed else 'FAIL'} {result.detail}"

    for check, fn in [
        (check_reduce_scatter_halving, reduce_scatter_halving),  # noqa: F821
        (check_allgather_doubling, allgather_doubling),  # noqa: F821
        (check_rabenseifner_allreduce, rabenseifner_allreduce),  # noqa: F821
        (check_rabenseifner_allreduce, careful_allreduce),
    ]:
        assert verdict(check, fn).startswith("PASS 4 ranks, partners r XOR 2^k"), fn
    # The library's ring: right numbers, same total bytes, wrong partners.
    partners = r"FAIL rank 0 sent to ranks \[1\] and received from \[3\]; its partners are .*"
    for check, fn in [
        (check_reduce_scatter_halving, C.ring_reduce_scatter),
        (check_allgather_doubling, C.ring_allgather),
        (check_rabenseifner_allreduce, C.ring_allreduce),
    ]:
        got = verdict(check, fn)
        assert re.fullmatch(partners, got), got
    builtin = r"FAIL rank \d uses the built-in comm\.{}; write it from send/recv"
    got = verdict(check_reduce_scatter_halving, builtin_reduce_scatter)
    assert re.fullmatch(builtin.format("reduce_scatter"), got), got
    for check in (check_allgather_doubling, check_rabenseifner_allreduce):
        got = verdict(check, builtin_allreduce)
        assert re.fullmatch(builtin.format("allreduce"), got), got
    got = verdict(check_rabenseifner_allreduce, doubling_whole_buffers)
    assert re.fullmatch(
        r"FAIL size 10: rank 0 sent 40 bytes to rank 1, the algorithm sends exactly 24 there "
        r"\(float32\); .*",
        got,
    ), got
    got = verdict(check_rabenseifner_allreduce, forgets_a_rank)
    assert re.match(r"FAIL size 10: the result on rank \d is wrong", got), got
    no_check: dict = {"np": np, "chunk_bounds": chunk_bounds}
    exec(NO_VALUE_ERROR, no_check)
    got = verdict(check_reduce_scatter_halving, no_check["reduce_scatter_halving"])
    assert got == f"FAIL {NO_VALUE_ERROR_REASON}", got
    # A2.3 on 3 ranks, folded: each usual mistake is right on 4 ranks and named on 3.
    for name, (code, reason) in FOLD_REASONS.items():
        mistake: dict = {"np": np, "chunk_bounds": chunk_bounds}
        exec(code, mistake)
        got = verdict(check_rabenseifner_allreduce, mistake["rabenseifner_allreduce"])
        assert got == f"FAIL {reason}", (name, got)
    # (the engines hold the source's answer again under its name, for later checks)
    got = verdict(check_rabenseifner_allreduce, rabenseifner_allreduce)  # noqa: F821
    assert got.endswith("float32 and float64; 3 ranks folded into 2"), got
