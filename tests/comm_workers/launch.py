"""Launch a worker script on N real processes with the mpi or gloo backend and collect its output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from course_lib.comm.setup import free_port

__all__ = ["WORKER", "launch", "mpiexec"]

WORKER = Path(__file__).with_name("worker.py")
ROOT = Path(__file__).resolve().parents[2]


def mpiexec() -> str | None:
    """Return the mpiexec beside this Python, if any."""
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else None


def launch(backend: str, n: int, suite: str, timeout: float = 120.0) -> list[dict]:
    """Run ``worker.py BACKEND SUITE`` on ``n`` processes; return each rank's JSON result.

    Raises AssertionError with every rank's output when a process fails or hangs.
    """
    outdir = tempfile.mkdtemp(prefix="comm_test_")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               COMM_RESULT_DIR=outdir)  # fmt: skip
    cmd = [sys.executable, str(WORKER), backend, suite]
    if backend == "mpi":
        procs = [subprocess.Popen([mpiexec(), "-n", str(n), *cmd], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)]  # fmt: skip
    else:
        port = free_port("127.0.0.1")  # never a hard-coded port (CS336's flaw)
        procs = [
            subprocess.Popen(cmd, env=dict(env, RANK=str(r), WORLD_SIZE=str(n), MASTER_PORT=str(port)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(n)
        ]  # fmt: skip
    outputs, failed = [], False
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n[launcher] killed after {timeout} s"
            failed = True
        failed |= proc.returncode != 0
        outputs.append(out)
    text = "\n".join(outputs)
    results = [json.loads(f.read_text()) for f in sorted(Path(outdir).glob("rank*.json"))]
    if failed or len(results) != n:
        raise AssertionError(f"{backend} x{n} suite {suite} failed:\n{text[-6000:]}")
    return sorted(results, key=lambda r: r["rank"])
