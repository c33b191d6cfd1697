"""Release and grading, end to end: real kernels under nbval, real engines for A2."""

from __future__ import annotations

import ast
import copy
import csv
import re
import time
from pathlib import Path

import nbformat
import numpy as np
import psutil
import pytest

from course_grader import grade as grade_module
from course_grader import runner
from course_grader.assignments.a2.checks import (
    check_allgather_doubling,
    check_rabenseifner_allreduce,
    check_reduce_scatter_halving,
)
from course_grader.assignments.a2.judge import rabenseifner_bytes_sent, rabenseifner_partners
from course_grader.cells import BEGIN, END, answer_id, check_id, stub_solution
from course_grader.grade import GradingLimits, grade_notebook
from course_grader.gradebook import grade_folder, write_feedback, write_gradebook
from course_grader.release import release_notebook
from course_grader.verdict.guard import (
    answer_problem,
    parse_python,
    protected_names,
    rejected_answers,
)
from course_lib import collectives as C
from course_lib import files
from course_lib.comm import chunk_bounds

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"
RELEASED = ROOT / "notebooks" / "assignments"
ASSIGNMENTS = [
    "A1_sgd_conv",
    "A2_rabenseifner_allreduce",
    "A3_data_parallel",
    "A4_local_sgd_gossip",
    "A5_compression",
    "A6_model_pipeline",
    "A7_zero_stage2",
    "A8_choosing_a_strategy",
]
# Generous per cell: A2's set-up cell starts 4 engines (11 s on a quiet machine). No test here
# expects a timeout under these limits, so a generous limit costs nothing.
LIMITS = GradingLimits(cell_seconds=45, total_seconds=300)
A1_FULL = {"A1.1": 2.0, "A1.2": 3.0, "A1.3": 3.0}
A2_FULL = {"A2.1": 3.0, "A2.2": 2.0, "A2.3": 3.0}


def _source(name: str) -> nbformat.NotebookNode:
    return nbformat.read(SOURCES / f"{name}.ipynb", as_version=4)


def _released(name: str) -> nbformat.NotebookNode:
    return nbformat.read(RELEASED / f"{name}.ipynb", as_version=4)


def _with_answer(nb: nbformat.NotebookNode, exercise: str, code: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if answer_id(cell) == exercise:
            cell.source = code
    return nb


def _points(rows) -> dict[str, float]:
    return {row.exercise: row.points for row in rows}


def _solutions(nb: nbformat.NotebookNode) -> list[str]:
    """Return the code lines inside every solution region of a source notebook."""
    lines = []
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            if BEGIN in line:
                inside = True
            elif END in line:
                inside = False
            elif inside and line.strip():
                lines.append(line.strip())
    return lines


# -- release -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_released_notebooks_are_up_to_date_and_hold_no_solution(name):
    source = _source(name)
    fresh = release_notebook(source, source.metadata["course"]["assignment"])
    committed = _released(name)
    assert nbformat.writes(committed) == nbformat.writes(fresh), (
        "notebooks/assignments is stale: run ./kit release"
    )
    # Nothing of the instructor's run: no saved progress bars, no execution timestamps.
    assert "widgets" not in committed.metadata
    assert not [c for c in committed.cells if "execution" in c.metadata]
    text = nbformat.writes(committed)
    assert BEGIN not in text and END not in text
    solution_lines = _solutions(source)
    assert len(solution_lines) >= 3
    code = "\n".join(c.source for c in committed.cells if c.cell_type == "code")
    leaked = [line for line in solution_lines if len(line) > 12 and line in code]
    assert not leaked, f"solution code in the released notebook: {leaked}"
    for cell in committed.cells:
        if answer_id(cell):
            assert f'raise NotImplementedError("Exercise {answer_id(cell)}: ' in cell.source
        if cell.cell_type == "code":
            assert cell.outputs == [] and "NBVAL_CHECK_OUTPUT" not in cell.source


def test_release_drops_widget_state_and_execution_timestamps():
    source = _source("A1_sgd_conv")
    source.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    for cell in source.cells:
        cell.metadata["execution"] = {"iopub.execute_input": "2026-11-22T01:04:26.428373Z"}
    released = release_notebook(source, "A1")
    text = nbformat.writes(released)
    assert "widget-state" not in text and "iopub" not in text
    assert answer_id(released.cells[3]) == "A1.1"  # the grader's metadata stays


def test_every_check_cell_imports_its_own_checker():
    # An answer that rebinds check_x earlier in the notebook cannot change what the check runs.
    for name in ASSIGNMENTS:
        for cell in _source(name).cells:
            if check_id(cell) is None:
                continue
            tree = ast.parse(cell.source)
            imported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
            called = {
                n.func.id
                for n in ast.walk(tree)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            }
            checkers = {c for c in called if c.startswith("check_")}
            assert checkers and checkers <= imported, (name, cell.source)


def test_gradebook_write_leaves_no_temporary_file_when_it_fails(tmp_path, monkeypatch):
    path = tmp_path / "gradebook.csv"
    path.write_text("old\n")

    def full_disk(*args):
        raise OSError("No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)  # the one writer: course_lib.files
    with pytest.raises(OSError):
        write_gradebook([], path)
    assert path.read_text() == "old\n" and list(tmp_path.iterdir()) == [path]


def test_stub_keeps_indentation_and_refuses_unbalanced_markers():
    source = f"def f(x):\n    y = 1\n    {BEGIN}\n    return x + y\n    {END}\n"
    stub = stub_solution(source, "9.9", 'add "y"')
    assert stub == "def f(x):\n    y = 1\n    raise NotImplementedError(\"Exercise 9.9: add 'y'\")"
    compile(stub, "<stub>", "exec")
    with pytest.raises(ValueError, match="unbalanced solution markers"):
        stub_solution(f"{BEGIN}\nx = 1\n", "9.9", "hint")


# -- the guard on answer cells (no kernel) -------------------------------------------------------

FORGED_VERDICT = (
    'check_smoothed_cross_entropy = lambda f: print("Exercise A1.1 smoothed_cross_entropy: PASS '
    "(loss and gradient equal to torch's label-smoothed cross-entropy in 5 cases, large logits "
    'included) [2/2 points]")'
)


@pytest.mark.parametrize(
    ("code", "found"),
    [
        (FORGED_VERDICT, "line 1 rebinds check_smoothed_cross_entropy"),
        ("def check_conv2d_backward(f):\n    pass", "rebinds check_conv2d_backward"),
        ("print = lambda *args: None", "rebinds print"),
        ("def f():\n    global verdict\n    verdict = 1", "line 2 rebinds verdict"),
        ("cluster = None", "rebinds cluster"),  # the A2 checks run on it
        (
            "from course_grader.assignments.a1.checks import check_sgd_momentum as c",
            "imports course_grader.assignments.a1.checks",
        ),
        ("from course_lib.checks import verdict as v", "imports course_lib.checks.verdict"),
        ("import course_grader.grade", "imports course_grader"),
        ('setattr(np, "allclose", lambda *a, **k: True)', "uses setattr"),
        ('globals()["check_sgd_momentum"] = None', "uses globals"),
        ('exec("x = 1")', "uses exec"),
        ("import importlib", "imports importlib"),
        ("import builtins", "imports builtins"),
        ('import sys\nsys.modules["course_grader.assignments.a1.checks"] = None', "sys.modules"),
        ("import sys\nsys.stdout = None", "changes sys.stdout"),
        ("np.allclose = lambda *a, **k: True", "changes np.allclose"),
        ("%run forged.py", "uses get_ipython"),  # magics become get_ipython() calls
        ("def f():\n    return f.__globals__", "uses the attribute __globals__"),
        ("from numpy import *", "imports * from numpy"),
        # the library's own answers, whichever way they are reached
        ("from course_lib.collectives import ring_allreduce", "library holds the reference"),
        ("from course_lib.training.scratch import conv2d", "library holds the reference"),
        ("from course_lib import collectives", "library holds the reference"),
        ("import course_lib.comm", "imports course_lib: the kit's library"),
        ("def f(comm, x):\n    return comm._builtin('allreduce', x)", "private attribute _builtin"),
        # the assignment's own list (A1: NumPy only)
        ("import torch.nn.functional as G", "imports torch.nn.functional, which this assignment"),
        ("def f(x):\n    from scipy import signal", "imports scipy.signal, which this assignment"),
    ],
)
def test_guard_names_what_an_answer_does_to_the_checks(code, found):
    protected = protected_names(_source("A2_rabenseifner_allreduce")) | {
        "check_smoothed_cross_entropy"
    }
    forbidden = _source("A1_sgd_conv").metadata["course"]["forbidden_imports"]
    problem = answer_problem(
        code, protected, modules={"np", "torch", "F"}, forbidden_imports=forbidden
    )
    assert problem is not None and found in problem, problem


def test_each_assignment_forbids_its_own_imports():
    conv_with_torch = (
        "import torch\n\ndef conv2d_backward(x, w, b):\n    return torch.conv2d(x, w, b)"
    )
    ring_from_mpi = "def ring_allreduce(comm, x):\n    from mpi4py import MPI\n    return x"
    a1, a2 = _source("A1_sgd_conv"), _source("A2_rabenseifner_allreduce")
    assert (
        "which this assignment does not allow"
        in rejected_answers(a1, {"A1.3": conv_with_torch})["A1.3"]
    )
    assert rejected_answers(a2, {"A2.3": conv_with_torch, "A2.1": ring_from_mpi}).keys() == {
        "A2.1",
        "A2.3",
    }
    assert rejected_answers(a1, {"A1.1": ring_from_mpi}) == {}  # A1 does not forbid mpi4py


def test_grader_parses_python_one_thread_at_a_time():
    """The gradebook grades in a thread pool; CPython 3.11 < 3.11.8 raises SystemError when two
    threads build ASTs at once (gh-106905), so every parse in the grader goes through one lock."""
    import sys
    import threading

    import course_grader as grading_package

    direct = [
        f"{path.name}:{number}"
        for path in Path(grading_package.__file__).parent.rglob("*.py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "ast.parse(" in line
        and "def parse_python" not in line
        and '"""' not in line
        and path.name != "guard.py"
    ]
    assert not direct, (
        f"parse with course_grader.verdict.guard.parse_python, not ast.parse: {direct}"
    )

    class Finalised:  # a finalizer that runs Python code lets another thread in mid-parse
        def __del__(self) -> None:
            sum(range(50))

    source = "\n".join(
        f"def f{i}(x):\n    return [{{'k': [x, (x, [x])]}} for a in x]" for i in range(100)
    )
    errors: list[str] = []

    def parse_many() -> None:
        try:
            for _ in range(30):
                parse_python(source)
                cycle = Finalised()
                cycle.me = cycle
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(exc))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=parse_many) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors


KEY_NAMES = {"A8_choosing_a_strategy": {"check_halo_messages"}}  # A8 has no cluster


def test_guard_lets_ordinary_answers_through():
    for name in ASSIGNMENTS:
        source = _source(name)
        protected = protected_names(source)
        # what the check cells use and no answer defines: A1's checks, A2-A6's cluster, A8's checks
        expected = KEY_NAMES.get(name, {"check_sgd_momentum", "cluster"})
        assert expected & protected and "verdict" in protected
        forbidden = source.metadata["course"]["forbidden_imports"]
        for cell in source.cells:
            if answer_id(cell):
                assert answer_problem(cell.source, protected, {"np"}, forbidden) is None, (
                    cell.source
                )
    ordinary = """
import math
import numpy as np
import torch
from course_lib.comm import chunk_bounds as bounds
from course_lib import comm

def helper(x):
    verdict = x.sum()  # a local of the student's own
    y = np.zeros(3)
    y[1:2] += math.pi
    return torch.as_tensor(y), verdict
"""
    assert answer_problem(ordinary, protected_names(_source("A1_sgd_conv")), {"np"}) is None


# -- grading A1 (kernels only) -------------------------------------------------------------------


def test_instructor_source_a1_gets_full_points():
    rows = grade_notebook("teacher", "A1", _source("A1_sgd_conv"), _source("A1_sgd_conv"), LIMITS)
    assert _points(rows) == A1_FULL
    assert all(row.reason == "PASS" for row in rows)


# A1.3's usual mistake: overlapping windows overwrite each other's share of dX.
A1_3_OVERWRITES = (
    "dXp[:, rows, cols] += np.tensordot",
    "dXp[:, rows, cols] = np.tensordot",
)


def test_a1_3_typical_mistake_loses_a1_3_only_with_its_reason():
    source = _source("A1_sgd_conv")
    answer = next(c.source for c in source.cells if answer_id(c) == "A1.3")
    assert A1_3_OVERWRITES[0] in answer
    submission = _with_answer(source, "A1.3", answer.replace(*A1_3_OVERWRITES))
    rows = grade_notebook("overwrites", "A1", source, submission, LIMITS)
    assert _points(rows) == dict(A1_FULL, **{"A1.3": 0.0}), rows
    reason = next(r.reason for r in rows if r.exercise == "A1.3")
    assert reason.startswith(
        "FAIL (dX (3x3 kernel, stride 1, padding 0) is right where one window reads a pixel and "
        "wrong where windows overlap"
    ), reason


def test_released_stub_a1_fails_every_check():
    rows = grade_notebook("blank", "A1", _source("A1_sgd_conv"), _released("A1_sgd_conv"), LIMITS)
    assert _points(rows) == dict.fromkeys(A1_FULL, 0.0)
    assert all(row.reason.startswith("FAIL (not implemented yet: Exercise A1.") for row in rows)


WRONG_MEAN = """
def smoothed_cross_entropy(W, b, X, y, eps):
    n, k = len(y), W.shape[1]
    Z = X @ W + b
    Z = Z - Z.max(axis=1, keepdims=True)
    log_P = Z - np.log(np.exp(Z).sum(axis=1, keepdims=True))
    Q = np.full((n, k), eps / k)
    Q[np.arange(n), y] += 1.0 - eps
    G = np.exp(log_P) - Q                   # forgot to divide by the batch size
    return -(Q * log_P).sum() / n, X.T @ G, G.sum(axis=0)
"""


def test_wrong_answer_fails_its_exercise_only_and_edited_outputs_do_not_help():
    released = _released("A1_sgd_conv")
    submission = _with_answer(released, "A1.1", WRONG_MEAN)
    source = _source("A1_sgd_conv")
    for ex in ("A1.2", "A1.3"):  # correct answers for the others, from the source
        answer = next(c.source for c in source.cells if answer_id(c) == ex)
        submission = _with_answer(submission, ex, answer)
    # The student also pastes the instructor's PASS lines into the stored outputs of A1.1.
    for cell, pristine in zip(submission.cells, source.cells, strict=True):
        if check_id(cell) == "A1.1":
            cell.outputs = copy.deepcopy(pristine.outputs)
    rows = grade_notebook("mixed", "A1", source, submission, LIMITS)
    assert _points(rows) == {"A1.1": 0.0, "A1.2": 3.0, "A1.3": 3.0}
    reason = next(r.reason for r in rows if r.exercise == "A1.1")
    assert reason.startswith("FAIL (dW (batch 8, 4 classes, eps 0.2) differs from the reference")


def test_edited_outputs_and_check_cells_are_graded_on_what_the_code_computes():
    submission = _released("A1_sgd_conv")
    source = _source("A1_sgd_conv")
    for cell, pristine in zip(submission.cells, source.cells, strict=True):
        if cell.cell_type == "code":  # every stored verdict now says PASS
            cell.outputs = copy.deepcopy(pristine.outputs)
            cell.execution_count = pristine.execution_count
        if check_id(cell):  # and every check cell just prints the PASS line
            cell.source = f"print({pristine.outputs[0]['text'].strip()!r})"
    rows = grade_notebook("forger", "A1", source, submission, LIMITS)
    assert _points(rows) == dict.fromkeys(A1_FULL, 0.0)


def test_a_hang_and_a_crash_cost_only_their_own_exercises():
    source = _source("A1_sgd_conv")
    submission = copy.deepcopy(source)
    submission = _with_answer(
        submission, "A1.2", "def sgd_momentum(*args):\n    while True:\n        pass"
    )
    submission = _with_answer(
        submission, "A1.3", "import os\nimport signal\nos.kill(os.getpid(), signal.SIGKILL)"
    )
    limits = GradingLimits(cell_seconds=8, total_seconds=300)
    started = time.monotonic()
    rows = grade_notebook("looper", "A1", source, submission, limits)
    assert _points(rows) == {"A1.1": 2.0, "A1.2": 0.0, "A1.3": 0.0}
    reasons = {r.exercise: r.reason for r in rows}
    # 16 s when the set-up cell (importing torch) ran out of 8 s on a loaded machine: retried.
    assert re.fullmatch(r"timed out \(cell limit (8|16) s\)", reasons["A1.2"]), reasons
    assert reasons["A1.3"].startswith(("timed out", "crashed its kernel"))
    assert time.monotonic() - started < 200


def test_total_time_limit_zeroes_the_notebook():
    source = _source("A1_sgd_conv")
    submission = source
    for ex in ("A1.1", "A1.2"):  # each cell stays under the cell limit; together they do not
        submission = _with_answer(submission, ex, "import time\ntime.sleep(8)")
    started = time.monotonic()
    rows = grade_notebook("slow", "A1", source, submission, GradingLimits(10, 12))
    assert time.monotonic() - started >= 12
    assert _points(rows) == dict.fromkeys(A1_FULL, 0.0)
    assert all("total time limit of 12 s" in r.reason for r in rows)


def _tiny_assignment(setup: str) -> nbformat.NotebookNode:
    """Return a one-exercise source whose set-up cell runs ``setup``; its answer is trivial."""
    nb = nbformat.v4.new_notebook(metadata=copy.deepcopy(_source("A1_sgd_conv").metadata))
    answer = nbformat.v4.new_code_cell(
        f"def answer():\n    {BEGIN}\n    return 42\n    {END}",
        metadata={"course": {"answer": "T.1"}},
    )
    check = nbformat.v4.new_code_cell(
        "# NBVAL_CHECK_OUTPUT\nprint(f\"Exercise T.1 answer: {'PASS' if answer() == 42 else 'FAIL'}\")",
        metadata={"course": {"check": "T.1", "points": 1}},
    )
    check.outputs = [nbformat.v4.new_output("stream", text="Exercise T.1 answer: PASS\n")]
    check.execution_count = 3  # nbval compares only cells that were run
    nb.cells = [nbformat.v4.new_code_cell(setup), answer, check]
    return nb


def test_a_slow_setup_cell_is_retried_with_twice_the_limit():
    limits = GradingLimits(cell_seconds=1.5, total_seconds=120)
    slowish = _tiny_assignment("import time\ntime.sleep(2)")  # over 1.5 s, well under 3 s
    rows = grade_notebook("ok", "T", slowish, slowish, limits)
    assert [(r.points, r.reason) for r in rows] == [(1.0, "PASS")]


# A grader working in the lab: every setting that would steer an assignment's start_cluster(n=N)
# to the room (here a room that does not exist: connecting would fail the set-up cell).
ROOM_SETTINGS = {
    "COURSE_CLUSTER_PROFILE": "lab",
    "COURSE_CLUSTER_FILE": "/nonexistent/ipcontroller-client.json",
    "COURSE_CLUSTER_KIND": "connect",
    "COURSE_CLUSTER_ENGINES": "not-a-number",
}


@pytest.mark.parametrize("sandbox", ["auto", None], ids=["sandbox", "unisolated"])
def test_the_graders_cluster_settings_never_reach_the_kernel(sandbox, tmp_path, monkeypatch):
    for name, value in ROOM_SETTINGS.items():
        monkeypatch.setenv(name, value)
    nb = _tiny_assignment(
        'import os\nleaked = sorted(k for k in os.environ if k.startswith("COURSE_CLUSTER_"))'
    )
    # The answer is 42 only in a kernel the settings did not reach (a failed set-up cell alone
    # would not cost the point: the check cell runs anyway).
    nb.cells[1].source = nb.cells[1].source.replace("return 42", "return leaked or 42")
    limits = GradingLimits(cell_seconds=45, total_seconds=120)
    rows = grade_notebook("lab", "T", nb, nb, limits, workdir=tmp_path, sandbox=sandbox)
    assert [(r.points, r.reason) for r in rows] == [(1.0, "PASS")], rows


def test_a_setup_cell_too_slow_twice_is_blamed_on_the_machine(monkeypatch):
    # nbval's answer for a set-up cell that runs out of time on every run (no kernel needed).
    runs = []

    def setup_times_out(path, cell_seconds, total_seconds, **sandbox):
        runs.append(cell_seconds)
        timeout = f"Cell 0: Timeout of {cell_seconds:g} seconds exceeded executing cell"
        return {0: ("failure", timeout), 1: ("skipped", ""), 2: ("skipped", "")}

    monkeypatch.setattr(grade_module, "run_nbval", setup_times_out)
    nb = _tiny_assignment("import torch")
    rows = grade_notebook("unlucky", "T", nb, nb, GradingLimits(20, 300))
    assert runs == [20, 40]
    assert [(r.points, r.reason) for r in rows] == [
        (
            0.0,
            "grading machine too slow: setup cell 0 exceeded 40 s; re-run with a longer "
            "--cell-timeout",
        )
    ]


def test_a_slow_tear_down_cell_costs_nothing_and_is_not_retried(monkeypatch):
    runs = []

    def teardown_times_out(path, cell_seconds, total_seconds, **sandbox):
        runs.append(cell_seconds)
        return {
            0: ("passed", ""),
            1: ("passed", ""),
            2: ("passed", ""),
            3: ("failure", "Timeout of"),
        }

    monkeypatch.setattr(grade_module, "run_nbval", teardown_times_out)
    nb = _tiny_assignment("import time")
    nb.cells.append(nbformat.v4.new_code_cell("cluster.stop()"))
    rows = grade_notebook("lucky", "T", nb, nb, GradingLimits(20, 300))
    assert runs == [20] and [(r.points, r.reason) for r in rows] == [(1.0, "PASS")]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_processes_a_run_leaves_behind_are_stopped_after_the_total_time_limit(tmp_path):
    # The kernel and a process it starts in a session of its own both outlive nbval's process
    # group when the total time limit kills it.
    pids = tmp_path / "pids.txt"
    nb = _tiny_assignment(
        "import os, subprocess, time\n"
        'child = subprocess.Popen(["sleep", "600"], start_new_session=True)\n'
        f'open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")\n'
        "time.sleep(600)"
    )
    # Unisolated (the fallback where no sandbox can be made): the kernel writes to tmp_path and
    # its processes are found by their mark. In the sandbox, its PID namespace ends them all.
    # On a loaded machine the kernel may not even reach the cell within 8 s: then the run proves
    # nothing about leftovers, so it is repeated with a longer limit (never a weaker assertion).
    for limit in (8, 24, 72):
        rows = grade_notebook(
            "stuck", "T", nb, nb, GradingLimits(limit, limit), workdir=tmp_path, sandbox=None
        )
        if pids.exists():
            break
    assert f"total time limit of {limit} s" in rows[0].reason
    kernel, child = map(int, pids.read_text().split())
    assert not _alive(kernel) and not _alive(child)


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
def test_a2_source_passes_stub_fails_and_ring_transcription_fails_on_partners(monkeypatch):
    # Graded by a grader working in the lab: A2's start_cluster(n=4) still gets local engines.
    for name, value in ROOM_SETTINGS.items():
        monkeypatch.setenv(name, value)
    source = _source("A2_rabenseifner_allreduce")
    rows = grade_notebook("teacher", "A2", source, source, LIMITS)
    assert _points(rows) == A2_FULL, rows
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


def _run_processes(ipython_dir: Path) -> dict[int, str]:
    """Return {pid: command line} of the live processes started for one grading run."""
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.environ().get("IPYTHONDIR") == str(ipython_dir):
                found[proc.pid] = " ".join(proc.info["cmdline"] or [])
        except (psutil.Error, OSError):
            continue
    return found


@pytest.mark.slow
def test_a_kernel_crash_leaves_no_engines_or_controller_behind(tmp_path, monkeypatch):
    seen: dict[int, str] = {}
    stop = runner.stop_clusters

    def stop_and_remember(ipython_dir: Path) -> None:
        seen.update(_run_processes(ipython_dir))  # what the run left, before the clean-up
        stop(ipython_dir)

    monkeypatch.setattr(runner, "stop_clusters", stop_and_remember)
    source = _tiny_assignment(
        'from course_lib.cluster import start_cluster\ncluster = start_cluster("local", 1)'
    )
    source.cells.append(nbformat.v4.new_code_cell("cluster.stop()"))
    crash = _with_answer(
        source, "T.1", "import os\nimport signal\nos.kill(os.getpid(), signal.SIGKILL)"
    )  # the engines are up by now
    # nbval notices a dead kernel only when the cell limit is up, so keep it short.
    # Unisolated, as above: in the sandbox the engines die with the kernel's PID namespace.
    rows = grade_notebook(
        "crasher", "T", source, crash, GradingLimits(15, 200), workdir=tmp_path, sandbox=None
    )
    assert rows[0].points == 0.0
    assert rows[0].reason.startswith(("crashed its kernel", "timed out")), rows
    left = [pid for pid, cmd in seen.items() if "ipyparallel" in cmd]
    assert len(left) >= 2, seen  # the dead kernel's controller and engine were still running...
    assert not [pid for pid in seen if _alive(pid)]  # ...and are gone now


# -- grading A5 (real engines: training inside the compressed exchange) --------------------------

A5_FULL = {"A5.1": 2.0, "A5.2": 1.0, "A5.3": 2.0, "A5.4": 2.0, "A5.5": 1.0, "A5.6": 2.0}


@pytest.mark.slow
def test_a5_source_answers_get_their_points_and_a_stub_loses_its_own_and_its_users():
    # One grading run (it trains twice on 2 engines): the source's answers everywhere but A5.3,
    # which keeps the released stub. A5.5's block top-k calls it, so A5.5 fails too; A5.6 trains
    # with block int8 only and passes, so training through the exchange is graded as well.
    source = _source("A5_compression")
    submission = _released("A5_compression")
    for cell in source.cells:
        if answer_id(cell) and answer_id(cell) != "A5.3":
            submission = _with_answer(submission, answer_id(cell), cell.source)
    rows = grade_notebook("partial", "A5", source, submission, LIMITS)
    assert _points(rows) == dict(A5_FULL, **{"A5.3": 0.0, "A5.5": 0.0}), rows
    reasons = {row.exercise: row.reason for row in rows}
    for exercise in ("A5.3", "A5.5"):
        assert reasons[exercise].startswith("FAIL (not implemented yet: Exercise A5.3: "), reasons


A6_FULL = {"A6.1": 2.0, "A6.2": 3.0, "A6.3": 3.0, "A6.4": 2.0}
A7_FULL = {"A7.1": 3.0, "A7.2": 2.0, "A7.3": 2.0, "A7.4": 3.0}
A8_FULL = {"A8.1": 5.0, "A8.2": 5.0}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("assignment", "name", "full"),
    [
        ("A5", "A5_compression", A5_FULL),
        ("A6", "A6_model_pipeline", A6_FULL),
        ("A7", "A7_zero_stage2", A7_FULL),
        ("A8", "A8_choosing_a_strategy", A8_FULL),
    ],
    ids=["a5", "a6", "a7", "a8"],
)
def test_graded_by_the_grader_source_full_stub_nothing_each_mistake_only_its_exercise(
    assignment, name, full
):
    # Judged outside the kernel (course_grader.assignments.a5.probe / a6 / a7 / a8), on a fresh seed per run.
    from course_grader.registry import probe_spec
    from course_grader.selftest.attacks import submissions

    mistakes = getattr(submissions, f"{assignment}_MISTAKES")
    source = _source(name)
    assert probe_spec(source) is not None  # the probes, not the in-kernel checks
    rows = grade_notebook("teacher", assignment, source, source, LIMITS)
    assert _points(rows) == full, rows
    rows = grade_notebook("blank", assignment, source, _released(name), LIMITS)
    assert _points(rows) == dict.fromkeys(full, 0.0), rows
    assert all(r.reason.startswith("FAIL (not implemented yet: Exercise ") for r in rows), rows
    answers = {answer_id(c): c.source for c in source.cells if answer_id(c)}
    submission = source
    for exercise, old, new, _ in mistakes:
        edited = submissions.edit_answer(answers[exercise], old, new)
        submission = _with_answer(submission, exercise, edited)
    rows = grade_notebook("typical", assignment, source, submission, LIMITS)
    assert _points(rows) == dict(full, **{exercise: 0.0 for exercise, *_ in mistakes}), rows
    reasons = {row.exercise: row.reason for row in rows}
    for exercise, _, _, reason in mistakes:
        assert reasons[exercise].startswith("FAIL (") and reason in reasons[exercise], reasons


def test_the_grader_judges_a5_a6_and_a7_from_probe_lines_alone():
    # The grader's half, no kernel: lines as a probe prints them, for the grader's seed.
    import json

    from course_grader.assignments.a5.checks import encode_cases
    from course_grader.assignments.a5.exchange import reference_encode
    from course_grader.assignments.a5.probe import a5_spec
    from course_grader.assignments.a6.probe import a6_spec
    from course_grader.verdict.probe import MARK, _encode, judge

    def line(values: list) -> str:
        return MARK + json.dumps([{"value": v} for v in values])

    def pair(q, scales) -> dict:
        return {"tuple": [_encode(q), _encode(scales)]}

    seed = 11
    right = [reference_encode(c["g"], c["block"]) for c in encode_cases(seed)]
    assert judge(a5_spec(), "A5.1", seed, line([pair(*r) for r in right])) == (True, "PASS")
    own = [reference_encode(g, b) for g, b in ((c["g"], c["block"]) for c in encode_cases(None))]
    passed, reason = judge(a5_spec(), "A5.1", seed, line([pair(*r) for r in own]))
    assert not passed and "expected max|g|" in reason, reason  # the notebook's inputs' answers
    a6_two_ranks = line([{"list": [{"tuple": [_encode(np.array(r)), _encode(np.array(2)),
                                             {"tuple": []}]} for r in range(2)]}])  # fmt: skip
    passed, reason = judge(a6_spec(), "A6.1", seed, a6_two_ranks)
    assert (passed, reason) == (False, "FAIL (the check needs 3 engines, not 2)")

    # A7.1 from the ring's shards and counters made here: the grader's seed passes, a sum fails.
    from course_grader.assignments.a7.collect import bucket
    from course_grader.assignments.a7.judge import a7_cases, ring_mean, sizes_of
    from course_grader.assignments.a7.probe import a7_spec
    from course_lib.comm import chunk_bounds

    def a7_ranks(case: dict, divide: bool) -> dict:
        m, n = case["m"], 3
        whole = ring_mean([bucket(m, case["seed"], r) for r in range(n)], n, divide).numpy()
        sizes, ranks = sizes_of(m, n), []
        for r, (lo, hi) in enumerate(chunk_bounds(m, n)):
            out, back = 4 * (m - sizes[r]), 4 * (m - sizes[(r - 1) % n])
            p2p = np.array(sorted([((r + 1) % n, 2, out, 0, 0), ((r - 1) % n, 0, 0, 2, back)]))
            data = {"tuple": [_encode(whole[lo:hi]), {"list": []}, _encode(p2p)]}
            ranks.append({"tuple": [_encode(np.array(r)), _encode(np.array(n)), data]})
        return {"list": ranks}

    cases = a7_cases("A7.1", seed)
    assert judge(a7_spec(), "A7.1", seed, line([a7_ranks(c, True) for c in cases]))[0]
    passed, reason = judge(a7_spec(), "A7.1", seed, line([a7_ranks(c, False) for c in cases]))
    assert not passed and "the sum over the 3 ranks, not their mean" in reason, reason


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


# -- a class -------------------------------------------------------------------------------------

# One of each of the 6 kinds below, plus an unreadable file: 7 notebooks over 2 grading jobs. A
# class of 30 is timed in bench/bench_grading_sandbox.py; the test keeps to what checks the
# gradebook.
CLASS_SIZE = 6


def _a_class(folder: Path) -> dict[str, dict[str, float]]:
    """Write CLASS_SIZE submissions in 6 kinds; return the points each one must get."""
    source, released = _source("A1_sgd_conv"), _released("A1_sgd_conv")
    correct = {ex: next(c.source for c in source.cells if answer_id(c) == ex) for ex in A1_FULL}
    expected = {}
    for i in range(CLASS_SIZE):
        kind = i % 6
        nb = copy.deepcopy(released)
        if kind in (0, 1, 2):  # all correct; kind 1 also re-orders and adds cells
            for ex, code in correct.items():
                nb = _with_answer(nb, ex, code)
            if kind == 1:
                nb.cells.reverse()
                nb.cells.insert(0, nbformat.v4.new_code_cell("scratch = 1 + 1"))
            if kind == 2:  # the conv answer is deleted entirely
                nb.cells = [c for c in nb.cells if answer_id(c) != "A1.3"]
            points = dict(A1_FULL, **({"A1.3": 0.0} if kind == 2 else {}))
        elif kind == 3:  # A1.1 wrong, others right
            for ex, code in correct.items():
                nb = _with_answer(nb, ex, WRONG_MEAN if ex == "A1.1" else code)
            points = {"A1.1": 0.0, "A1.2": 3.0, "A1.3": 3.0}
        elif kind == 4:  # A1.1 rebinds the checker to print PASS; others right
            for ex, code in correct.items():
                nb = _with_answer(nb, ex, FORGED_VERDICT if ex == "A1.1" else code)
            points = {"A1.1": 0.0, "A1.2": 3.0, "A1.3": 3.0}
        else:  # untouched stub
            points = dict.fromkeys(A1_FULL, 0.0)
        student = f"student{i:02d}"
        (folder / student).mkdir(parents=True)
        nbformat.write(nb, folder / student / "A1_sgd_conv.ipynb")
        expected[student] = points
    (folder / "broken").mkdir()
    (folder / "broken" / "A1_sgd_conv.ipynb").write_text("{ not json")
    expected["broken"] = dict.fromkeys(A1_FULL, 0.0)
    return expected


@pytest.mark.slow
def test_grading_a_class_writes_a_correct_gradebook(tmp_path):
    expected = _a_class(tmp_path / "submissions")
    started = time.perf_counter()
    rows = grade_folder(tmp_path / "submissions", SOURCES, LIMITS, jobs=2, progress=False)
    write_gradebook(rows, tmp_path / "grades" / "gradebook.csv")
    feedback = write_feedback(rows, tmp_path / "grades" / "feedback")
    print(f"graded {len(expected)} submissions in {time.perf_counter() - started:.0f} s")
    with open(tmp_path / "grades" / "gradebook.csv", newline="") as handle:
        book = list(csv.DictReader(handle))
    got: dict[str, dict[str, float]] = {}
    for row in book:
        got.setdefault(row["student"], {})[row["exercise"]] = float(row["points"])
        assert row["reason"]
    assert got == expected
    assert len(feedback) == len(expected)
    text = (tmp_path / "grades" / "feedback" / "student03.md").read_text()
    assert "Total: 6 / 8 points" in text and "A1 exercise A1.1: 0 / 2" in text
    broken = next(r for r in book if r["student"] == "broken")
    assert "could not read the notebook" in broken["reason"]
    forger = {r["exercise"]: r["reason"] for r in book if r["student"] == "student04"}
    assert forger["A1.1"].startswith(
        "not graded: the answer cell line 1 rebinds check_smoothed_cross_entropy, which the check "
        "cells use"
    )
    assert forger["A1.2"] == forger["A1.3"] == "PASS"
