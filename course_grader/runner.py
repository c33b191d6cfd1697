"""No lecture (the grader). Run one notebook under nbval in a subprocess, with time limits, and clean up after it.

Nothing the notebook's processes wrote is trusted: the grader never parses, imports or runs a
file from a place they can write. In the sandbox, ``$IPYTHONDIR`` (profiles, cluster files) is
inside the sandbox's size-limited ``/tmp``, and the kernel, the ipyparallel controller and
engines and whatever an answer spawns all die with the sandbox's PID namespace when its first
process ends. Each run's host-side processes (nbval's kernel launcher, and unisolated every
process of the run) carry a mark of the run in their environment (a fresh ``IPYTHONDIR``);
after the run, whatever still carries it is killed. Killing the sandbox's launcher ends its
PID namespace (its first process has a parent-death signal), and with it everything inside.

The only things read back are nbval's JUnit report and the outputs of the grader's probe
cells (:mod:`course_grader.verdict.probe`), both written by nbval outside the sandbox from the
kernel's messages.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from course_grader.sandbox.cgroup import sandbox_cgroup
from course_grader.sandbox.config import (
    SandboxLimits,
    host_tmpfs,
    kernel_name,
    kit_package,
    prepare_sandbox,
)
from course_grader.sandbox.wire_audit import wire_problem_here

__all__ = ["CLUSTER_VARIABLE_PREFIX", "NBVAL_PLUGINS", "run_nbval", "stop_clusters"]

#: The variables that tell ``start_cluster`` where engines come from (``COURSE_CLUSTER_PROFILE``,
#: ``_FILE``, ``_KIND``, ``_ENGINES``: :mod:`course_lib.cluster.launch`). None reaches a run.
CLUSTER_VARIABLE_PREFIX = "COURSE_CLUSTER_"

#: The plugins of nbval's process, loaded in this order: nbformat without the IRI grammar
#: (:mod:`course_grader.lean_nbformat`) before nbval imports it; nbval; the grader's side of a run.
NBVAL_PLUGINS = ("course_grader.lean_nbformat", "nbval.plugin", "course_grader.sandbox.nbval_ipc")
_ANSI = re.compile(r"\x1b\[[0-9;]*m|#x1B\[[0-9;]*m")
RUNTIME_MB = 4  # the kernel's connection file and sockets: a few kB
#: The largest JUnit report read: nbval's messages are cut (:mod:`.sandbox.nbval_ipc`), so a
#: report of a few cells' errors is kilobytes.
MAX_REPORT_BYTES = 16 * 2**20

#: nbval's process dies with the grader that started it (Linux's parent-death signal, which an
#: exec keeps; the grader's PID is checked after setting it, so a grader already gone counts),
#: and the sandbox dies with nbval (:mod:`course_grader.sandbox.enter`).
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n    sys.exit(137)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def stop_clusters(ipython_dir: Path) -> None:
    """Kill every process that carries this run's mark (``IPYTHONDIR=ipython_dir``).

    No file is read: an ipyparallel cluster file names the commands that stop it, so one
    forged by the notebook would run them here (an ``SSHControllerLauncher`` with any
    ``ssh_cmd``). The mark is in the environment the grader gave the run's processes;
    /proc is read as data only.
    """
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
    blocked: tuple[str, ...] = (),
    kit: bool = True,
    probes: Path | None = None,
    cut: tuple[str, ...] = (),
) -> dict[int, tuple[str, str]] | None:
    """Run nbval on ``path``; return {cell number: (outcome, message)}, or None past the limit.

    With ``sandbox``, the kernel (and all it starts) runs in a sandbox with those limits, which
    never shows it ``hidden`` nor lets it import ``blocked``, and shows it the kit only when
    ``kit``, less the functions ``cut`` (see :mod:`course_grader.sandbox.config`); nbval stays outside. ``probes``: the
    folder (the grader's, never shown to the kernel) where nbval stores the probe cells' outputs.
    """
    xml = path.with_suffix(".xml")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(path),
        "--nbval-lax",
        f"--nbval-cell-timeout={cell_seconds:g}",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--junitxml={xml}",
        "-o",
        "addopts=",
        "--rootdir",
        str(path.parent),
    ]
    # Clusters started by the notebook record themselves under IPYTHONDIR: a folder per run
    # tells the clean-up below which ones are this run's.
    ipython_dir = Path(tempfile.mkdtemp(prefix="ipython-", dir=path.parent))
    # The kernel inherits nbval's environment. A grader working in the lab may carry the room's
    # settings (COURSE_CLUSTER_PROFILE=lab): an assignment's start_cluster(n=4) would then take
    # a seat in the room, or fail in the sandbox that cannot reach it. A submission is graded on
    # this machine's local engines, whatever the grader's shell says.
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLUSTER_VARIABLE_PREFIX)}
    env["IPYTHONDIR"] = str(ipython_dir)
    # The kit's messages in English whatever the grader's shell or the folder (course_lib.i18n):
    # the check cells' stored verdicts are compared, and a Russian edition's code is the English.
    env["COURSE_LANG"] = "en"
    # nbval loads this kit's plugin, not one a venv's editable install points to elsewhere.
    kit_root = str(kit_package().parent)
    env["PYTHONPATH"] = os.pathsep.join([kit_root, *filter(None, [env.get("PYTHONPATH")])])
    # nbval and the kit's plugin alone: pytest's other installed plugins (hypothesis, anyio,
    # xdist, timeout) cost each run about 1.3 s of CPU to import and play no part in it; and
    # nbformat's IRI grammar, never used, about 1 s more (NBVAL_PLUGINS).
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for plugin in NBVAL_PLUGINS:
        cmd += ["-p", plugin]
    if probes is not None:
        env["COURSE_PROBE_DIR"] = str(probes)
    env.pop("COURSE_IPC", None)
    env.pop("COURSE_WIRE_AUDIT", None)
    share = contextlib.nullcontext([])
    if sandbox is not None and sandbox.share:
        cpus = sandbox.cpus or float(os.cpu_count() or 1)
        share = sandbox_cgroup(cpus, sandbox.total_memory_mb)
    with share as cgroups:
        return _run_nbval(cmd, path, env, total_seconds, ipython_dir, sandbox, hidden, blocked,
                          kit, tuple(cgroups), cut)  # fmt: skip


def _run_nbval(cmd, path, env, total_seconds, ipython_dir, sandbox, hidden, blocked, kit, cgroups,
               cut=()):  # fmt: skip
    """:func:`run_nbval`'s second half: the sandbox's settings, the run, the report."""
    xml = path.with_suffix(".xml")
    shared = contextlib.nullcontext(False)
    run_dir = None
    if sandbox is not None:
        # In the system's temporary folder, not beside the notebook: the kernel's Unix sockets
        # live in it, and a socket's path may not pass 107 bytes.
        run_dir = Path(tempfile.mkdtemp(prefix="sandbox-"))
        config = (*hidden, str(path.parent)), blocked, kit, cgroups, cut
        env.update(prepare_sandbox(run_dir, sandbox, *config))
        env["COURSE_IPC"] = "1"
        if wire_problem_here() is None:  # nbval counts the bytes between the sandbox's processes
            env["COURSE_WIRE_AUDIT"] = "1"
        cmd = [*cmd, "--nbval-kernel-name=" + kernel_name()]
        shared = host_tmpfs(run_dir / "runtime", RUNTIME_MB)
    with shared:
        finished = _run(cmd, path, env, total_seconds, ipython_dir)
    if run_dir is not None:
        shutil.rmtree(run_dir, ignore_errors=True)  # unlinks; follows no link, opens no file
    return _read_report(xml) if finished else None


def _run(cmd: list[str], path: Path, env: dict, total_seconds: float, ipython_dir: Path) -> bool:
    """Run nbval; kill what is left of the run afterwards. False: past the total time limit."""
    if sys.platform.startswith("linux"):
        cmd = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *cmd]
    try:
        # A session of its own, so that on the total time limit pytest and the processes that
        # stay in its session go down together (the kernel and engines are found by the mark).
        proc = subprocess.Popen(
            cmd,
            cwd=path.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        try:
            proc.wait(timeout=total_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False
    finally:
        stop_clusters(ipython_dir)
        shutil.rmtree(ipython_dir, ignore_errors=True)
    return True


def _read_report(xml: Path) -> dict[int, tuple[str, str]]:
    """Read nbval's JUnit report (written by nbval, outside the sandbox)."""
    if not xml.exists() or xml.stat().st_size > MAX_REPORT_BYTES:
        return {}  # none, or not one nbval wrote from cut messages: every check reads as not run
    results = {}
    try:
        cases = list(ET.parse(xml).iter("testcase"))
    except ET.ParseError:
        return {}
    for case in cases:
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
