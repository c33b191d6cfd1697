"""What one notebook can cost the grading machine: its output held outside, its processes after the grader.

An output flood (a stdout flood and an exception message of hundreds of MiB) graded beside an
honest student: the host-side nbval process stays under a stated bound (measured while it runs:
``FLOOD_RSS_MB``), the flooder keeps what its answers earned, the honest student gets full marks.
A grader killed mid-notebook takes its nbval and the sandbox (kernel and all) with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from course_grader.cells import answer_id, check_id, check_points
from course_grader.grade import GradingLimits
from course_grader.gradebook import grade_folder
from course_grader.sandbox.config import SandboxLimits, sandbox_problem
from course_grader.selftest.attacks.submissions import write_submission

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"
_PROBLEM = sandbox_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM)),
]
#: The host-side nbval process's resident memory, at most, while it grades a flooding notebook
#: (measured: 338 MiB peak, twice, over both notebooks of the class; the messages nbval may hold
#: at once, 4 queued and 1 read, of 33 MiB at most, and their decoded copies, above pytest's own).
#: Without the caps, the issue's 2 GiB flood grew it to 3.5 GB.
FLOOD_RSS_MB = 400
FLOOD = "for _ in range(1024):\n    print('x' * 2**20)  # 1 GiB on stdout\n"
RAISE = "raise RuntimeError('y' * 200 * 2**20)  # a 200 MiB exception message\n"


def _nbval_rss(stop: threading.Event, peak: dict) -> None:
    """Sample every nbval process this test started (the grader's children) until ``stop``."""
    me = psutil.Process()
    while not stop.is_set():
        for proc in me.children(recursive=True):
            try:
                if "--nbval-lax" in proc.cmdline():
                    peak["rss"] = max(peak.get("rss", 0), proc.memory_info().rss)
            except psutil.Error:
                continue
        time.sleep(0.05)


def test_an_output_flood_is_cut_and_the_host_side_stays_bounded(tmp_path):
    source = nbformat.read(SOURCES / "A1_sgd_conv.ipynb", as_version=4)
    correct = {answer_id(c): c.source for c in source.cells if answer_id(c)}
    points = {check_id(c): check_points(c) for c in source.cells if check_id(c)}
    subs = tmp_path / "submissions"
    write_submission(source, subs, "honest", correct)
    flooding = dict(correct, **{"A1.1": correct["A1.1"] + "\n" + FLOOD,
                                "A1.2": correct["A1.2"] + "\n" + RAISE})  # fmt: skip
    write_submission(source, subs, "flooder", flooding)
    stop, peak = threading.Event(), {}
    sampler = threading.Thread(target=_nbval_rss, args=(stop, peak), daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        rows = grade_folder(subs, SOURCES, GradingLimits(60, 400), jobs=2, progress=False,
                            sandbox=SandboxLimits(processes=256))  # fmt: skip
    finally:
        stop.set()
        sampler.join()
    seconds = time.monotonic() - started
    got = {(r.student, r.exercise): r for r in rows}
    print(f"nbval's peak RSS {peak.get('rss', 0) / 2**20:.0f} MiB; class graded in {seconds:.0f} s")
    assert {ex: got[("honest", ex)].points for ex in points} == points, rows
    assert got[("flooder", "A1.1")].points == points["A1.1"], (
        rows
    )  # the flood cut, the answer right
    assert got[("flooder", "A1.3")].points == points["A1.3"], rows
    assert len(got[("flooder", "A1.2")].reason) < 1000, got[("flooder", "A1.2")].reason[:300]
    assert 0 < peak["rss"] < FLOOD_RSS_MB * 2**20, peak


_GRADER = """
import sys
from pathlib import Path
import nbformat
from course_grader.grade import GradingLimits, grade_notebook
from course_grader.sandbox.config import SandboxLimits
source = nbformat.read(Path(sys.argv[1]), as_version=4)
sub = nbformat.read(Path(sys.argv[2]), as_version=4)
grade_notebook("sleeper", "A1", source, sub, GradingLimits(300, 600),
               sandbox=SandboxLimits(processes=256))
"""


def test_a_sandbox_dies_with_the_grader_that_started_it(tmp_path):
    source = nbformat.read(SOURCES / "A1_sgd_conv.ipynb", as_version=4)
    answers = {answer_id(c): c.source for c in source.cells if answer_id(c)}
    answers["A1.1"] = "import time\ntime.sleep(600)\n"
    path = write_submission(source, tmp_path, "sleeper", answers)
    grader = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_GRADER), str(SOURCES / "A1_sgd_conv.ipynb"),
         str(path)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    try:
        deadline, below = time.monotonic() + 180, []
        while time.monotonic() < deadline and not any(_is_sandbox(p) for p in below):
            time.sleep(0.5)
            below = psutil.Process(grader.pid).children(recursive=True)
        assert any(_is_sandbox(p) for p in below), "the sandbox never started"
        time.sleep(8)  # the notebook reaches the answer that sleeps, its engines-free set-up done
        below = psutil.Process(grader.pid).children(recursive=True)
        grader.send_signal(signal.SIGKILL)
        grader.wait()
        _gone, alive = psutil.wait_procs(below, timeout=20)
        assert not alive, [(p.pid, _name(p)) for p in alive]
    finally:
        if grader.poll() is None:
            grader.kill()


def _is_sandbox(proc: psutil.Process) -> bool:
    try:
        return "sandbox/enter.py" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _name(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:80]
    except psutil.Error:
        return "?"


# The starvation test (busy processes beside an honest notebook on one core) is graded beside the
# attack class, in tests/grader/selftest/test_grading_attacks.py.
