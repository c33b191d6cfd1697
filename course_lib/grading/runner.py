"""Run one notebook under nbval in a subprocess, with time limits, and clean up after it.

The run's kernel, and the ipyparallel controller and engines the notebook starts, all run in
sessions of their own (jupyter_client and ipyparallel start them so), so killing the nbval
process group on the total time limit does not reach them. Each run therefore gets its own
``IPYTHONDIR``: the clusters record themselves in it, and every process started for the run
carries it in its environment. After the run, whatever is left is stopped by that mark.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from course_lib.grading.sandbox import SandboxLimits, kernel_name, prepare_sandbox

__all__ = ["run_nbval", "stop_clusters"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m|#x1B\[[0-9;]*m")


def stop_clusters(ipython_dir: Path) -> None:
    """Stop every ipyparallel cluster recorded in ``ipython_dir``, then every process left there.

    A cluster writes ``profile_*/security/cluster-*.json`` with the pids of its controller and
    engines; ipyparallel stops them from that file (TERM, then KILL). Processes it does not know
    (the kernel, engines whose file was never written, what the student's code started) carry
    this run's ``IPYTHONDIR`` in their environment, and are killed by that mark.
    """
    profiles = [str(p) for p in ipython_dir.glob("profile_*") if (p / "security").is_dir()]
    if any(Path(p, "security").glob("cluster-*.json") for p in profiles):
        import ipyparallel as ipp

        quiet = logging.getLogger("course_lib.grading.clusters")
        quiet.setLevel(logging.CRITICAL)
        try:
            clusters = ipp.ClusterManager(log=quiet).load_clusters(profile_dirs=profiles)
        except Exception:  # noqa: BLE001 - a damaged file must not stop the sweep below
            clusters = {}
        for cluster in clusters.values():
            try:
                cluster.stop_cluster_sync()
            except Exception:  # noqa: BLE001 - already gone, or half gone: the sweep finishes it
                pass
    import psutil

    left = []
    for proc in psutil.process_iter():
        try:
            mark = proc.environ().get("IPYTHONDIR")
        except (psutil.Error, OSError):
            continue  # another user's process, or gone meanwhile
        if mark == str(ipython_dir):
            try:
                proc.kill()
                left.append(proc)
            except psutil.Error:
                pass
    psutil.wait_procs(left, timeout=5)


def run_nbval(
    path: Path,
    cell_seconds: float,
    total_seconds: float,
    sandbox: SandboxLimits | None = None,
    hidden: tuple[str, ...] = (),
) -> dict[int, tuple[str, str]] | None:
    """Run nbval on ``path``; return {cell number: (outcome, message)}, or None past the limit.

    With ``sandbox``, the kernel (and all it starts) runs in a sandbox with those limits, which
    never shows it ``hidden`` (see :mod:`course_lib.grading.sandbox`); nbval stays outside.
    """
    xml = path.with_suffix(".xml")
    cmd = [
        sys.executable, "-m", "pytest", str(path), "--nbval-lax",
        f"--nbval-cell-timeout={cell_seconds:g}", "-p", "no:cacheprovider",
        "-q", f"--junitxml={xml}", "-o", "addopts=", "--rootdir", str(path.parent),
    ]  # fmt: skip
    # Clusters started by the notebook record themselves under IPYTHONDIR: a folder per run
    # tells the clean-up below which ones are this run's.
    ipython_dir = Path(tempfile.mkdtemp(prefix="ipython-", dir=path.parent))
    env = {**os.environ, "IPYTHONDIR": str(ipython_dir)}
    if sandbox is not None:
        run_dir = Path(tempfile.mkdtemp(prefix="sandbox-", dir=path.parent))
        env.update(prepare_sandbox(run_dir, ipython_dir, sandbox, (*hidden, str(path.parent))))
        cmd += ["-p", "course_lib.grading.nbval_ipc", f"--nbval-kernel-name={kernel_name()}"]
    try:
        # A session of its own, so that on the total time limit pytest and the processes that
        # stay in its session go down together (the kernel and engines are found by the mark).
        proc = subprocess.Popen(
            cmd, cwd=path.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )  # fmt: skip
        try:
            proc.wait(timeout=total_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
    finally:
        stop_clusters(ipython_dir)
        shutil.rmtree(ipython_dir, ignore_errors=True)
    if not xml.exists():
        return {}
    results = {}
    for case in ET.parse(xml).iter("testcase"):
        match = re.search(r"Cell (\d+)", case.get("name", ""))
        if not match:
            continue
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                message = _ANSI.sub("", (child.get("message") or "") + "\n" + (child.text or ""))
        results[int(match[1])] = (outcome, message)
    return results
