"""The bytes on the wire: counted by the Linux kernel, held against what the ranks reported.

Fast: two real processes talk over real TCP and the socket table says exactly how many bytes
each sent; the grader's comparison on hand-written records (agreement passes; traffic the ranks
did not report, payload they did not send, an unknown labelling each fail, naming the pair).
The built-in collectives on hand-written records of what gloo's rings moved (measured): either
way round passes; a call more, a bigger buffer, a star instead of the ring fail.
Slow: answers that let a built-in collective do the work and rewrite ``comm.stats`` to hide it
(:mod:`course_grader.selftest.attacks.counters`) pass the exercises' own judges (the counters alone)
and get 0 in the sandbox, naming the bytes on the wire, while the honest exercises beside them
keep their points.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_grader.cells import answer_id
from course_grader.grade import GradingLimits, grade_notebook
from course_grader.sandbox.config import SandboxLimits, sandbox_problem
from course_grader.sandbox.wire_audit import (
    ancestry,
    flows,
    namespace_pid,
    settled_sockets,
    sockets,
    wire_problem_here,
)
from course_grader.selftest.attacks.counters import FORGED_COUNTERS, WIRE_REASON
from course_grader.verdict.claims import (
    BARRIER_LEAST,
    BARRIER_MOST,
    PER_MESSAGE_RECEIVED,
    PER_MESSAGE_SENT,
    PER_PAIR,
    ClaimsBuilder,
)
from course_grader.verdict.wire import (
    PIDS_MARK,
    UNACCOUNTED_MOST,
    decode_pids,
    wire_problem,
)

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"
_WIRE = wire_problem_here()
needs_wire = pytest.mark.skipif(_WIRE is not None, reason=str(_WIRE))

_SERVER = """
import socket, sys
open("/proc/self/comm", "w").write("pid=1")
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
sys.stdin.readline()  # go
need = int(sys.stdin.readline())
got = 0
while got < need:
    got += len(conn.recv(1 << 16))
conn.sendall(b"x" * 11)
print(got, flush=True)
sys.stdin.readline()
"""
_CLIENT = """
import socket, sys
# a name of its own choosing, as ss -p would print it: the grader books sockets by PID only
open("/proc/self/comm", "w").write("pid=1,fd=3 ino:")
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
sys.stdin.readline()  # go
conn.sendall(b"y" * int(sys.stdin.readline()))
print(len(conn.recv(64)), flush=True)
sys.stdin.readline()
"""


def _start(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@needs_wire
def test_the_socket_table_counts_the_bytes_between_two_processes_exactly():
    server = _start(_SERVER)
    port = server.stdout.readline().strip()
    client = _start(_CLIENT, port)
    try:
        assert client.stdout.readline().strip() == "connected"
        before = sockets()
        for proc in (server, client):
            proc.stdin.write("go\n123457\n")
            proc.stdin.flush()
        assert server.stdout.readline().strip() == "123457"
        assert client.stdout.readline().strip() == "11"
        moved = flows(before, settled_sockets())
        assert moved.get((client.pid, server.pid)) == 123457, moved
        assert moved.get((server.pid, client.pid)) == 11, moved
    finally:
        for proc in (server, client):
            proc.kill()
            proc.wait()


# A process alone in a network namespace of its own (as a sandbox is): on "open" it connects to
# itself and sends 50 000 bytes it keeps open, on "close" another 50 000 over a connection it
# closes at once; it answers "done" each time.
_ALONE = """
import socket, sys
listener = socket.create_server(("127.0.0.1", 0))
kept = []
print("ready", flush=True)
for line in sys.stdin:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    client.sendall(b"z" * 50000)
    got = 0
    while got < 50000:
        got += len(server.recv(1 << 16))
    if line.strip() == "close":
        client.close()
        server.close()
    else:
        kept += [client, server]
    print("done", flush=True)
"""


@needs_wire
def test_bytes_over_a_connection_closed_between_the_snapshots_are_still_counted():
    from course_grader.sandbox.wire_audit import loopback, unaccounted

    alone = subprocess.Popen(
        [
            "unshare",
            "--net",
            "sh",
            "-c",
            f"ip link set lo up && exec {sys.executable} -c '{_ALONE}'",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert alone.stdout.readline().strip() == "ready"
        netns = f"/proc/{alone.pid}/ns/net"

        def moved(command: str) -> int:
            before = sockets(netns)
            loopback_before = loopback(netns)
            alone.stdin.write(command + "\n")
            alone.stdin.flush()
            assert alone.stdout.readline().strip() == "done"
            settled_sockets(netns)
            loopback_after = loopback(netns)
            after = sockets(netns)
            delta = (loopback_after[0] - loopback_before[0], loopback_after[1] - loopback_before[1])
            return unaccounted(before, after, delta)

        assert moved("open") == 0  # still open at the end: every byte is on a socket
        hidden = moved("close")
        assert 50000 <= hidden <= 50000 + 64, hidden  # gone from the table, not from the count
    finally:
        alone.kill()
        alone.wait()


def test_a_process_outside_any_sandbox_is_its_own_pid():
    import os

    assert namespace_pid(os.getpid()) == os.getpid()
    assert ancestry(os.getpid())[0] == os.getpid()


# -- the grader's comparison, on hand-written records -------------------------------------------

PIDS = [40, 41, 42]  # the engines' PIDs inside the sandbox, by rank
STDOUT = PIDS_MARK + "[40, 41, 42]\n"


def _framed(payload: int, sent: int, received: int) -> int:
    """What a pair carries for ``sent`` messages of ``payload`` bytes, ``received`` back."""
    return payload + 224 * sent + 96 * received


def _ring_claims() -> dict:
    """3 ranks, each sending 2 messages of 100 bytes to the next."""
    return {(r, (r + 1) % 3): (200, 2, 0) for r in range(3)}


def _ring_record(extra: dict | None = None) -> dict:
    moved = []
    for r in range(3):
        q = (r + 1) % 3
        moved.append([[PIDS[r], 7], [PIDS[q], 7], _framed(200, 2, 0)])
        moved.append([[PIDS[q], 7], [PIDS[r], 7], _framed(0, 0, 2)])  # the receiver's replies
    for (a, b), nbytes in (extra or {}).items():
        moved.append([[a, 7], [b, 7], nbytes])
    return {"flows": moved}


def test_agreeing_counts_pass():
    assert wire_problem(_ring_claims(), _ring_record(), STDOUT) is None
    # The engines' own traffic with the controller (PID 7) is not between ranks.
    assert wire_problem(_ring_claims(), _ring_record({(40, 7): 10**6}), STDOUT) is None
    # A child the answer starts on rank 1 speaks for rank 1.
    child = _ring_record()
    child["flows"][0][1] = [99, PIDS[1], 7]
    assert wire_problem(_ring_claims(), child, STDOUT) is None
    assert wire_problem(_ring_claims(), None, STDOUT) is None  # not audited: counters alone


def test_traffic_the_ranks_did_not_report_fails_naming_the_pair():
    hidden = wire_problem(_ring_claims(), _ring_record({(40, 42): PER_PAIR + 100}), STDOUT)
    assert hidden and hidden.startswith("rank 0 sent rank 2 ") and "reported 0 bytes" in hidden
    small = wire_problem(_ring_claims(), _ring_record({(40, 42): PER_PAIR // 2}), STDOUT)
    assert small is None  # within a pair's allowance (a subgroup's rendezvous)
    claims = _ring_claims()
    most = 200 + PER_MESSAGE_SENT * 2 + PER_MESSAGE_RECEIVED * 0 + PER_PAIR
    over = wire_problem(claims, _ring_record({(40, 41): most - _framed(200, 2, 0) + 1}), STDOUT)
    assert over and over.startswith("rank 0 sent rank 1"), over


def test_payload_the_ranks_reported_but_never_sent_fails():
    claims = _ring_claims()
    claims[(0, 1)] = (5000, 2, 0)
    problem = wire_problem(claims, _ring_record(), STDOUT)
    assert problem and "reported 5000 bytes in 2 messages" in problem


def test_barriers_the_ranks_reported_must_be_on_every_pair_within_their_bounds():
    builder = ClaimsBuilder()
    for r, q in _ring_claims():
        builder.sent(r, q, 200, 2)
    for r in range(3):
        builder.barriers(r, 3, 2)  # two barriers on every rank
    claims = builder.claims
    assert claims[(0, 1)] == (200 + 2 * BARRIER_LEAST, 2, 2 * (BARRIER_MOST - BARRIER_LEAST))
    called = {(a, b): 300 * 2 for a in PIDS for b in PIDS if a != b}  # 300 B a barrier a pair
    assert wire_problem(claims, _ring_record(called), STDOUT) is None
    # Barriers reported but never called: a pair that carried nothing lacks their least bytes.
    alone = ClaimsBuilder()
    alone.barriers(0, 3, 2)
    missing = wire_problem(alone.claims, {"flows": []}, STDOUT)
    assert missing and "reported 80 bytes (at most" in missing, missing
    # Reported barriers cover a few hundred bytes of other traffic a pair, not more.
    hidden = {**called, (40, 42): 2 * BARRIER_MOST + PER_PAIR + 200}
    assert "rank 0 sent rank 2" in wire_problem(claims, _ring_record(hidden), STDOUT)


# What 4 engines' gloo put on each pair for one call on 10 000 float32, measured
# (bench/bench_wire_framing.py): the kit's agreement alone (184 B) between ranks two apart, the
# ring's chunks one way round and their acknowledgements the other.
PIDS4 = [40, 41, 42, 43]
STDOUT4 = PIDS_MARK + "[40, 41, 42, 43]\n"
MEASURED = {"allreduce": (-1, 61336, 760), "allgather": (+1, 120760, 472)}


def _one_call(name: str, calls: int = 1, direction: int | None = None) -> dict:
    """The record of ``calls`` calls of built-in ``name`` on 4 ranks, as gloo's ring moved it."""
    way, ring, acks = MEASURED[name]
    way = way if direction is None else direction
    moved = []
    for r in range(4):
        for q in range(4):
            nbytes = {(r + way) % 4: ring, (r - way) % 4: acks}.get(q, 184)
            if q != r:
                moved.append([[PIDS4[r], 7], [PIDS4[q], 7], nbytes * calls])
    return {"flows": moved}


def _reported(name: str, calls: int = 1, nbytes: int = 40000, world_size: int = 4) -> list:
    builder = ClaimsBuilder()
    for r in range(world_size):
        builder.builtins(r, world_size, [(name, calls, nbytes * calls), ("barrier", 0, 0)])
    return builder.alternatives()


@pytest.mark.parametrize("name", ["allreduce", "allgather"])
def test_a_builtin_collective_agrees_with_gloos_ring_either_way_round(name):
    assert wire_problem(_reported(name), _one_call(name), STDOUT4) is None
    assert wire_problem(_reported(name, 3), _one_call(name, 3), STDOUT4) is None
    turned = _one_call(name, direction=-MEASURED[name][0])  # a gloo that turned its ring round
    assert wire_problem(_reported(name), turned, STDOUT4) is None
    # One call reported, two made: the second's agreement is on the pairs two apart.
    twice = wire_problem(_reported(name), _one_call(name, 2), STDOUT4)
    assert twice and re.search(WIRE_REASON, twice), twice
    # One more agreement between ranks two apart: a call of a collective nobody reported.
    agreed = _one_call(name)
    agreed["flows"].append([[PIDS4[0], 7], [PIDS4[2], 7], 184])
    assert "rank 0 sent rank 2 368 bytes" in wire_problem(_reported(name), agreed, STDOUT4)
    # A buffer reported bigger than the one sent.
    bigger = wire_problem(_reported(name, nbytes=44000), _one_call(name), STDOUT4)
    assert bigger and re.search(WIRE_REASON, bigger), bigger


def test_a_broadcast_from_a_known_root_follows_gloos_binomial_tree():
    # rank 0's 40 000 B to ranks 1 and 2, rank 1's to rank 3 (measured on 4 engines: the buffer
    # and 96 B a message, 48 B back; the kit's agreement, 184 B, on every pair).
    tree = {(0, 1), (0, 2), (1, 3)}
    moved = []
    for a in range(4):
        for b in range(4):
            nbytes = 40000 + 280 if (a, b) in tree else 232 if (b, a) in tree else 184
            if a != b:
                moved.append([[PIDS4[a], 7], [PIDS4[b], 7], nbytes])
    builder = ClaimsBuilder()
    for r in range(4):
        builder.builtins(r, 4, [("broadcast", 1, 40000)], broadcast_root=0)
    assert wire_problem(builder.alternatives(), {"flows": moved}, STDOUT4) is None
    # From rank 1 instead: the tree is another one, and the wire says so.
    other = ClaimsBuilder()
    for r in range(4):
        other.builtins(r, 4, [("broadcast", 1, 40000)], broadcast_root=1)
    problem = wire_problem(other.alternatives(), {"flows": moved}, STDOUT4)
    assert problem and re.search(WIRE_REASON, problem), problem


def test_reports_that_are_negative_unknown_or_contradict_the_records_are_refused():
    """Claims come from the answer's process: a negative count would buy room for hidden
    traffic, an unknown built-in would hide bytes from the judges, and A3's step records (what
    the judge reads) must add up to the counts (what the wire is held against)."""
    from course_grader.assignments.a3.probe import a3_claims

    with pytest.raises(ValueError, match="negative"):
        ClaimsBuilder().sent(0, 1, -5000, 1)
    for used in ([("alltoall", 1, 8)], [("allreduce", 1, -8)], [("barrier", -3, 0)]):
        with pytest.raises(ValueError, match="rank 2 reported"):
            ClaimsBuilder().builtins(2, 4, used)
    records = [[rank, step, 100, 0] for step in range(2) for rank in range(2)]
    # Each rank: the set-up's broadcast, then 2 barriers and 200 B in 2 messages to the other.
    counters = [(([("broadcast", 1, 64)], []), ([("barrier", 2, 0)], [(1 - r, 2, 200, 2, 200)]))
                for r in range(2)]  # fmt: skip
    run = (2, 1, 0.0, 0, 0, [], records, counters)
    assert a3_claims([run])  # they agree
    moved = [*counters[:1], (counters[1][0], ([("allreduce", 2, 400)], []))]
    with pytest.raises(ValueError, match="rank 1's counts of the training run"):
        a3_claims([(*run[:7], moved)])


def test_a_builtin_reported_but_done_by_messages_to_one_rank_fails():
    # An allreduce reported, done as a star: every rank sends rank 0 its buffer and gets the sum.
    star = {"flows": []}
    for r in range(1, 4):
        star["flows"].append([[PIDS4[r], 7], [PIDS4[0], 7], 40000 + 224 + 184])
        star["flows"].append([[PIDS4[0], 7], [PIDS4[r], 7], 40000 + 224 + 184])
    problem = wire_problem(_reported("allreduce"), star, STDOUT4)
    assert problem and re.search(WIRE_REASON, problem), problem
    # A broadcast is not modelled: its bytes are never explained by a report.
    assert wire_problem(_reported("broadcast"), _one_call("allreduce"), STDOUT4)


def test_the_engines_pids_must_reach_the_grader():
    assert "process ids never reached" in wire_problem(_ring_claims(), _ring_record(), "")
    assert decode_pids(PIDS_MARK + "[40, 40, 42]") is None  # one process cannot be two ranks
    assert decode_pids(PIDS_MARK + '["40"]') is None
    assert decode_pids("noise\n" + STDOUT) == PIDS
    closed = dict(_ring_record(), unaccounted=UNACCOUNTED_MOST + 1)
    assert "outside the connections open at the end" in wire_problem(_ring_claims(), closed, STDOUT)
    assert wire_problem(_ring_claims(), dict(closed, unaccounted=48), STDOUT) is None
    # A labelling of other processes: the ranks' reported traffic is then not on the wire.
    elsewhere = PIDS_MARK + "[50, 51, 52]"
    assert "reported 200 bytes" in wire_problem(_ring_claims(), _ring_record(), elsewhere)
    failed = wire_problem(_ring_claims(), {"error": "ss: permission denied"}, STDOUT)
    assert failed and "could not count the bytes on the wire: ss" in failed


# -- end to end: counters rewritten after a built-in collective ---------------------------------

_SANDBOX = sandbox_problem()


def _with_answer(notebook: str, exercise: str, edit) -> tuple:
    """The source and a submission whose ``exercise`` answer is ``edit(the source's answer)``."""
    source = nbformat.read(SOURCES / f"{notebook}.ipynb", as_version=4)
    submission = copy.deepcopy(source)
    for cell in submission.cells:
        if answer_id(cell) == exercise:
            cell.source = edit(cell.source)
    return source, submission


def _forged(notebook: str, assignment: str, *exercises: str) -> tuple:
    """The source and a submission whose ``exercises`` are the counter-forging answers."""
    source = nbformat.read(SOURCES / f"{notebook}.ipynb", as_version=4)
    submission = copy.deepcopy(source)
    for cell in submission.cells:
        if answer_id(cell) in exercises:
            cell.source = FORGED_COUNTERS[(assignment, answer_id(cell))]
    return source, submission


def _lost_to_the_wire(rows: list, *exercises: str) -> dict:
    """Assert ``exercises`` got 0 with the wire's reason; return the rows by exercise."""
    got = {r.exercise: r for r in rows}
    for exercise in exercises:
        assert got[exercise].points == 0.0, rows
        assert re.search(WIRE_REASON, got[exercise].reason), rows
    return got


def _graded(student: str, assignment: str, source, submission, tmp_path, seconds: float) -> list:
    """Grade ``submission`` in the sandbox, as ``./kit grade`` does."""
    return grade_notebook(
        student,
        assignment,
        source,
        submission,
        GradingLimits(seconds, 600),
        tmp_path,
        sandbox=SandboxLimits(processes=256),
    )


@pytest.mark.slow
@needs_wire
@pytest.mark.skipif(_SANDBOX is not None, reason=str(_SANDBOX))
def test_a2_counters_rewritten_after_a_builtin_lose_their_points_to_the_wire(tmp_path):
    """The wire's check runs only once the exercise's own judge passed, so a FAIL with its reason
    means the counters alone gave full marks (graded without the sandbox: 3/3, seen)."""
    source, submission = _forged("A2_rabenseifner_allreduce", "A2", "A2.1")
    rows = _graded("forger", "A2", source, submission, tmp_path, 90)
    got = _lost_to_the_wire(rows, "A2.1")
    assert got["A2.2"].points == 2.0, rows  # the honest exercise beside it keeps its points
    assert got["A2.3"].points == 0.0, rows  # A2.3 calls the forged A2.1: its bytes are forged too


@pytest.mark.slow
@needs_wire
@pytest.mark.skipif(_SANDBOX is not None, reason=str(_SANDBOX))
def test_a4_counters_rewritten_lose_their_points_to_the_model_of_gloos_ring(tmp_path):
    """A4.1 averages with two allreduce calls and reports one; A4.3 gossips through the built-in
    allgather and reports sendrecv's messages. Both pass their judges on the counters alone."""
    source, submission = _forged("A4_local_sgd_gossip", "A4", "A4.1", "A4.3")
    rows = _graded("forger", "A4", source, submission, tmp_path, 90)
    got = _lost_to_the_wire(rows, "A4.1", "A4.3")
    # A4.2 averages through the forged A4.1, whose reset of the counters its own judge sees.
    assert got["A4.2"].points == 0.0 and "allreduce calls" in got["A4.2"].reason, rows


@pytest.mark.slow
@needs_wire
@pytest.mark.skipif(_SANDBOX is not None, reason=str(_SANDBOX))
def test_a3_counters_rewritten_lose_their_exercises_training_run_included(tmp_path):
    """A3.1 and A3.3 average with the built-in allreduce and rewrite the counters to say the
    parameter server's and the ring's messages: in the probe calls and, step after step, in the
    training run through the kit's data-parallel seam. A3.2 beside them keeps its points."""
    source, submission = _forged("A3_data_parallel", "A3", "A3.1", "A3.3")
    rows = _graded("forger", "A3", source, submission, tmp_path, 120)
    got = _lost_to_the_wire(rows, "A3.1", "A3.3")
    assert got["A3.2"].points == 2.0, rows


@pytest.mark.slow
@needs_wire
@pytest.mark.skipif(_SANDBOX is not None, reason=str(_SANDBOX))
def test_a9_ring_counters_rewritten_after_an_allgather_lose_their_exercise_only(tmp_path):
    source, submission = _forged("A9_ring_attention", "A9", "A9.2")
    rows = _graded("forger", "A9", source, submission, tmp_path, 120)
    got = _lost_to_the_wire(rows, "A9.2")
    assert got["A9.1"].points == 4.0, rows


@pytest.mark.slow
@needs_wire
@pytest.mark.skipif(_SANDBOX is not None, reason=str(_SANDBOX))
def test_an_honest_answer_with_barriers_keeps_every_point(tmp_path):
    """A barrier moves no data but has bytes on the wire: the ranks report it and it is allowed,
    also in an answer that only attaches hooks, whose traffic comes later, inside backward (A7.1)."""
    anchor = "    n = comm.world_size\n"

    def with_barriers(answer: str) -> str:
        assert anchor in answer
        return answer.replace(anchor, anchor + "    comm.barrier()\n" * 2, 1)

    source, submission = _with_answer("A7_zero_stage2", "A7.1", with_barriers)
    rows = _graded("careful", "A7", source, submission, tmp_path, 120)
    assert {r.exercise: r.points for r in rows} == {"A7.1": 6, "A7.2": 4}, rows
