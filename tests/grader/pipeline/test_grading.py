"""Grading end to end with real kernels under nbval: A1, the limits, a whole class."""

from __future__ import annotations

import copy
import csv
import json
import re
import time
from pathlib import Path

import nbformat
import numpy as np
import psutil
import pytest
from grading_notebooks import (
    A1_FULL,
    FORGED_VERDICT,
    LIMITS,
    ROOM_SETTINGS,
    SOURCES,
)
from grading_notebooks import (
    alive as _alive,
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

from course_grader import grade as grade_module
from course_grader import runner
from course_grader.cells import BEGIN, END, answer_id, check_id
from course_grader.grade import GradingLimits, grade_notebook
from course_grader.gradebook import grade_folder, write_feedback, write_gradebook
from course_grader.verdict.probe import MARK, ExerciseProbe, ProbeSpec, _encode
from course_lib.checks.verdict import Verdict, run_check

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
    nb.metadata["course"]["assignment"] = "T"
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


def _check_answer(answer, *, verbose: bool = False, seed: int = 0) -> Verdict:
    """T.1's judge, in the grader: the answer returns 42."""

    def body() -> str:
        got = answer()
        assert got == 42, f"answer() returned {got!r}, not 42"
        return ""

    return run_check("T.1", "answer", body, verbose=verbose)


#: The tiny assignment's probe: the kernel (shown the library) calls answer(), the grader judges.
TINY = ProbeSpec("", {"T.1": ExerciseProbe(lambda seed: [{}], "answer()", _check_answer)}, kit=True)


def _answered_42(sandbox: dict) -> None:
    """Store the probe line the tiny check cell (cell 2) prints for a right answer, as nbval does."""
    line = MARK + json.dumps([{"value": _encode(np.asarray(42))}])  # numbers travel as .npy
    (Path(sandbox["probes"]) / "probe-2.json").write_text(json.dumps({"stdout": line}))


def test_a_slow_setup_cell_is_retried_with_twice_the_limit():
    limits = GradingLimits(cell_seconds=1.5, total_seconds=120)
    slowish = _tiny_assignment("import time\ntime.sleep(2)")  # over 1.5 s, well under 3 s
    rows = grade_notebook("ok", "T", slowish, slowish, spec=TINY, limits=limits)
    assert [(r.points, r.reason) for r in rows] == [(1.0, "PASS")]


# A grader working in the lab: every setting that would steer an assignment's start_cluster(n=N)
# to the room (here a room that does not exist: connecting would fail the set-up cell).


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
    rows = grade_notebook(
        "lab", "T", nb, nb, spec=TINY, limits=limits, workdir=tmp_path, sandbox=sandbox
    )
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
    rows = grade_notebook("unlucky", "T", nb, nb, spec=TINY, limits=GradingLimits(20, 300))
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
        _answered_42(sandbox)  # the check cell's probe line, as nbval's plugin stores it
        return {
            0: ("passed", ""),
            1: ("passed", ""),
            2: ("passed", ""),
            3: ("failure", "Timeout of"),
        }

    monkeypatch.setattr(grade_module, "run_nbval", teardown_times_out)
    nb = _tiny_assignment("import time")
    nb.cells.append(nbformat.v4.new_code_cell("cluster.stop()"))
    rows = grade_notebook("lucky", "T", nb, nb, spec=TINY, limits=GradingLimits(20, 300))
    assert runs == [20] and [(r.points, r.reason) for r in rows] == [(1.0, "PASS")]


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
            "stuck",
            "T",
            nb,
            nb,
            GradingLimits(limit, limit),
            workdir=tmp_path,
            sandbox=None,
            spec=TINY,
        )
        if pids.exists():
            break
    assert f"total time limit of {limit} s" in rows[0].reason
    kernel, child = map(int, pids.read_text().split())
    assert not _alive(kernel) and not _alive(child)


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
        "crasher",
        "T",
        source,
        crash,
        GradingLimits(15, 200),
        workdir=tmp_path,
        sandbox=None,
        spec=TINY,
    )
    assert rows[0].points == 0.0
    assert rows[0].reason.startswith(("crashed its kernel", "timed out")), rows
    left = [pid for pid, cmd in seen.items() if "ipyparallel" in cmd]
    assert len(left) >= 2, seen  # the dead kernel's controller and engine were still running...
    assert not [pid for pid in seen if _alive(pid)]  # ...and are gone now


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
