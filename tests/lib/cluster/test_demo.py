"""`./kit demo` end to end: the command starts its own engines, trains with several exchange
methods and prints a table in which every method equals one process; bad input is one line.

Tolerance: each method's weights must be within 2e-5 of one process trained on the whole global
batch (``course_lib.parallel.data_parallel.reference.ATOL``). The two differ by float32 rounding only (the
distributed mean sums N means of B/N samples, one process takes one mean of B): measured, 3e-8
after this test's 6 steps, 1e-7 to 2e-7 after 20 steps of SGD with momentum on 2 and 4 engines,
so 2e-5 leaves over 100x, and it is over 5 000x below source 000's published averaging, which
the same table must show as DIFFERS (0.11 after this test's 6 steps on 2 engines).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.demo import BATCH, DEFAULT_METHODS, MAX_STEPS
from course_lib.parallel.data_parallel.reference import ATOL

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[3]
GRADIENT_KB = 4 * (64 * 128 + 128 + 128 * 10 + 10) / 1e3  # the MLP's 9 610 float32 gradients
BROKEN = "parameter_server_source000"  # source 000's averaging: the row that must differ


def run_demo(args: list[str], ipython_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``python -m course_lib.demo ARGS`` in its own IPython directory; SIGTERM on timeout."""
    env = dict(
        os.environ,
        IPYTHONDIR=str(ipython_dir),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "course_lib.demo", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the demo stops its engines on the way out
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the demo did not finish within {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def table_rows(out: str) -> dict[str, list[str]]:
    """Return the demo's table as {method: its columns} (between the dashes and a blank line)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("-----")) + 1
    end = lines.index("", start)
    return {line.split()[0]: line.split()[1:] for line in lines[start:end]}


def test_the_demo_shows_every_method_equal_to_one_process(tmp_path):
    methods = [*DEFAULT_METHODS, BROKEN]
    done = run_demo(
        ["--engines", "2", "--steps", "6", "--methods", ",".join(methods)], tmp_path, timeout=400
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    out = done.stdout
    # The doctor's report: a row per engine (its verdict is not asserted: an engine slow to
    # answer its 5 s ping on a loaded machine is reported, and the demo goes on).
    assert re.search(r"^engine +rank .*\n0 +0 .*\n1 +1 .*\n(OK|PROBLEMS)", out, re.M), out
    accuracy = out.split("test accuracy ")[1].split(" %")[0]
    assert 20 < float(accuracy) <= 100, out  # 35 % after 6 steps; untrained 7 %, chance 10 %
    rows = table_rows(out)
    assert list(rows) == methods, out
    for method, cols in rows.items():
        step, compute, _wait, comm, sent, sent_max, gloo, diff = cols[:8]
        assert float(step) > 0 and float(compute) > 0, (method, cols)
        # Per rank and step, 2 ranks: the server and its worker each send S, the ring
        # 2(N-1)/N S = S; ddp hands the whole gradient to gloo's allreduce instead.
        p2p = 0.0 if method == "ddp" else GRADIENT_KB
        assert float(sent) == pytest.approx(p2p, abs=0.1), (method, cols)
        assert float(sent_max) == pytest.approx(p2p, abs=0.1), (method, cols)
        assert float(gloo) == pytest.approx(GRADIENT_KB - p2p, abs=0.1), (method, cols)
        verdict = " ".join(cols[9:])
        if method == BROKEN:
            assert float(diff) > 100 * ATOL and verdict.startswith("DIFFERS"), (method, cols)
        else:
            assert float(diff) < ATOL and verdict == "= one process", (method, cols)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--engines", "0"], "--engines 2"),
        (["--steps", "-1"], f"1 to {MAX_STEPS}"),
        (["--steps", str(MAX_STEPS + 1)], f"1 to {MAX_STEPS}"),
        (["--methods", "ring,allreduce_ring"], "'allreduce_ring'; give comma-separated names from"),
        (["--kind", "cloud"], "'local', 'mpi', 'connect'"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(tmp_path, args, names):
    done = run_demo(args, tmp_path, timeout=120)
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("kit demo: ") and names in lines[0], lines[0]


def test_max_steps_is_one_pass_over_the_training_digits():
    from course_lib.data.digits import load_digits

    assert MAX_STEPS == len(load_digits()) // BATCH
