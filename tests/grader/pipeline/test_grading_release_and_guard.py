"""Release (stubs, no solutions, up to date) and the ast guard on answer cells: no kernel."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from grading_notebooks import (
    ASSIGNMENTS,
    FORGED_VERDICT,
)
from grading_notebooks import (
    released_notebook as _released,
)
from grading_notebooks import (
    solution_lines as _solutions,
)
from grading_notebooks import (
    source_notebook as _source,
)

from course_grader.cells import BEGIN, END, answer_id, check_id, stub_solution
from course_grader.gradebook import write_gradebook
from course_grader.release import release_notebook
from course_grader.verdict.guard import (
    answer_problem,
    parse_python,
    protected_names,
    rejected_answers,
)
from course_lib import files

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
