"""Launch a worker script on N real processes with the mpi or gloo backend and collect its output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from course_lib.comm.setup import free_port

__all__ = [
    "LEAVE_WITHOUT_FINALIZE",
    "WORKER",
    "address_in_use",
    "launch",
    "launch_suites",
    "mpiexec",
    "result_file",
]

WORKER = Path(__file__).with_name("worker.py")
ROOT = Path(__file__).resolve().parents[2]
GRACE = 10.0  # seconds the other ranks get to report their own errors after one rank failed
# Suites after which a rank leaves with os._exit, skipping MPI_Finalize / gloo's teardown (a peer
# may still hold a mismatched message). MPICH's mpiexec then kills every rank still running with
# SIGKILL and, when rank 0 is among them, exits 9 ("BAD TERMINATION"), even though each rank
# wrote its result before leaving: a race with the machine's load. For these suites a world
# passes when every rank wrote its result, whatever mpiexec's exit code.
LEAVE_WITHOUT_FINALIZE = ("errors", "timeouts", "p2p_timeout", "leave_unevenly", "ring_sizes")


def mpiexec() -> str | None:
    """Return the mpiexec beside this Python, if any."""
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else None


def address_in_use(output: str) -> bool:
    """Return True when a rank's output says its port was taken (EADDRINUSE)."""
    text = output.lower()
    return "address already in use" in text or "eaddrinuse" in text


def result_file(suite: str, rank: int) -> str:
    """Return the name of the file in which ``rank`` writes ``suite``'s result."""
    return f"{suite}.rank{rank}.json"


def launch(backend: str, n: int, suite: str, timeout: float = 120.0) -> list[dict]:
    """Run ``worker.py BACKEND SUITE`` on ``n`` processes; return each rank's JSON result.

    Raises AssertionError with every rank's output when a process fails or hangs.
    """
    done, failure = launch_suites(backend, n, [suite], timeout)
    if failure is not None:
        raise AssertionError(failure)
    return done[suite]


def launch_suites(
    backend: str, n: int, suites: list[str], timeout: float = 120.0
) -> tuple[dict[str, list[dict]], str | None]:
    """Run ``suites`` one after another on one world of ``n`` processes.

    Returns each suite that every rank finished (its results in rank order) and, when the world
    failed or hung, a message with every rank's output (the first suite missing from the dict
    failed; the ones after it did not run). A gloo world whose port was taken between
    :func:`free_port` and rank 0 binding it (another program can grab it in the seconds torch
    takes to import) is retried once on a new port.
    """
    for attempt in (1, 2):
        workdir = Path(tempfile.mkdtemp(prefix="comm_test_"))
        outdir = workdir / "results"  # only the suites' result files here
        outdir.mkdir()
        failed, text = _run_world(backend, n, suites, workdir, outdir, timeout)
        if failed and backend == "gloo" and attempt == 1 and address_in_use(text):
            continue
        break
    done: dict[str, list[dict]] = {}
    for suite in suites:
        files = [outdir / result_file(suite, r) for r in range(n)]
        if not all(f.exists() for f in files):
            break
        done[suite] = [json.loads(f.read_text()) for f in files]
    shutil.rmtree(workdir, ignore_errors=True)
    if failed or len(done) < len(suites):
        lost = suites[len(done)] if len(done) < len(suites) else suites[-1]
        done.pop(lost, None)  # a failed world's last suite is not trusted
        return (
            done,
            f"{backend} x{n} suite {lost} failed (world: {','.join(suites)}):\n{text[-6000:]}",
        )
    return done, None


def _run_world(
    backend: str, n: int, suites: list[str], workdir: Path, outdir: Path, timeout: float
) -> tuple[bool, str]:
    """Start one world, wait for it; return (whether it failed, every process's output)."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "assignments/source/lectures")]),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        COMM_RESULT_DIR=str(outdir),
    )
    cmd = [sys.executable, str(WORKER), backend, ",".join(suites)]
    if backend == "mpi":
        worlds = [([mpiexec(), "-n", str(n), *cmd], env)]
    else:
        port = free_port("127.0.0.1")  # never a hard-coded port (CS336's flaw)
        worlds = [
            (cmd, dict(env, RANK=str(r), WORLD_SIZE=str(n), MASTER_PORT=str(port)))
            for r in range(n)
        ]
    # Output goes to files, not pipes: a pipe nobody reads while we poll could fill and block.
    logs = [workdir / f"out{i}.txt" for i in range(len(worlds))]
    procs = []
    for (args, proc_env), log in zip(worlds, logs, strict=True):
        with open(log, "w") as sink:
            procs.append(
                subprocess.Popen(args, env=proc_env, stdout=sink, stderr=subprocess.STDOUT)
            )
    notes = _wait_all(procs, logs, timeout)
    outputs = [log.read_text(errors="replace") for log in logs]
    # mpiexec's exit code says nothing after ranks left without MPI_Finalize; the caller then
    # counts the result files (a rank that raised wrote none and printed FAILED)
    exit_codes_count = not (backend == "mpi" and suites[-1] in LEAVE_WITHOUT_FINALIZE)
    failed = bool(notes) or (exit_codes_count and any(proc.returncode != 0 for proc in procs))
    text = "\n".join(
        f"--- process {i} (exit code {proc.returncode})\n{out}"
        for i, (proc, out) in enumerate(zip(procs, outputs, strict=True))
    )
    return failed, text + "".join(f"\n[launcher] {note}" for note in notes)


def _wait_all(procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> list[str]:
    """Wait for every process; kill the rest once one failed (after GRACE) or on timeout."""
    deadline, failed_at, notes = time.monotonic() + timeout, None, []
    while any(proc.poll() is None for proc in procs):
        now = time.monotonic()
        bad = [i for i, proc in enumerate(procs) if proc.returncode not in (None, 0)]
        if bad and failed_at is None:
            failed_at = now
            # a taken port fails rank 0 at once and leaves the others waiting for it: stop now
            if address_in_use(logs[bad[0]].read_text(errors="replace")):
                failed_at -= GRACE
        if failed_at is not None and now - failed_at >= GRACE:
            notes.append(f"process(es) {bad} failed; killed the others, which waited for them")
            break
        if now > deadline:
            notes.append(f"killed after {timeout:g} s")
            break
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return notes
