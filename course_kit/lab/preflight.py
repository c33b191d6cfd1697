"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): Before ``./kit lab start`` starts anything: every PC reachable, the kit there, the same versions.

One SSH call per PC (all PCs at once) runs the PC's Python from the hosts file and asks it for
the versions that must agree across the room (Python, the kit, ipyparallel, pyzmq, torch);
each PC that fails gives one line naming the fix. Also here: finding a controller of the
profile that an earlier, failed start left behind (it would take the new engines' registrations).
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import Any

from course_kit.lab.hosts import LabHosts, LabPC

__all__ = ["PACKAGES", "check_pcs", "leftover_controllers", "versions_here"]

PACKAGES = ("course-lib", "ipyparallel", "pyzmq", "torch")
MARK = "KIT-VERSIONS "
# One line, with neither double quotes nor anything a shell expands inside them, so that
# `PYTHON -c "..."` means the same to a Linux PC's sh and a Windows PC's cmd.exe.
_ASK = (
    "import json, platform; from importlib import metadata, util; "
    "d = {(x.metadata['Name'] or '').lower().replace('_', '-'): x.version "
    "for x in metadata.distributions()}; "
    f"v = {{n: d.get(n) for n in {PACKAGES!r}}}; "
    "v.update(python=platform.python_version(), kit=util.find_spec('course_lib') is not None); "
    f"print({MARK!r} + json.dumps(v))"
)
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")


def versions_here() -> dict[str, Any]:
    """Return the versions of this PC (the instructor's), as :func:`check_pcs` asks every PC."""
    names = {
        (dist.metadata["Name"] or "").lower().replace("_", "-"): dist.version
        for dist in metadata.distributions()
    }
    return {
        "python": platform.python_version(),
        "kit": True,
        **{name: names.get(name) for name in PACKAGES},
    }


def _check_one(hosts: LabHosts, pc: LabPC, here: dict[str, Any], timeout: float) -> str | None:
    """Return one line saying what is wrong with ``pc``, or None when it is ready."""
    where = hosts.path or "the hosts file"
    windows = "\\" in pc.python or pc.python.lower().endswith(".exe")
    python = f'"{pc.python}"' if windows else shlex.quote(pc.python)
    command = f'{python} -c "{_ASK}"'
    try:
        done = subprocess.run(
            [*hosts.ssh, *SSH_OPTIONS, pc.host, command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"{pc.host}: SSH did not answer within {timeout:.0f} s: is the PC on and reachable?"
    except OSError as exc:
        return f"{pc.host}: cannot run {hosts.ssh[0]} ({exc}): fix [ssh] command in {where}"
    err = (done.stderr.strip().splitlines() or [""])[-1]
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(MARK)), None)
    if done.returncode == 255 or (line is None and "ssh" in err.lower()):
        return (
            f"{pc.host}: SSH cannot reach it ({err or 'exit 255'}): switch it on, check its "
            f"network and SSH server, or leave it out of {where}"
        )
    if line is None:
        return (
            f"{pc.host}: no working Python at {pc.python} ({err or f'exit {done.returncode}'}): "
            f"install the kit there or fix python = in {where}"
        )
    there = json.loads(line[len(MARK) :])
    if not there.get("kit"):
        return (
            f"{pc.host}: the kit is not installed for {pc.python} (no course_lib): install it there"
        )
    differ = [
        f"{name} {there.get(name)} (here {here[name]})"
        for name in ("python", *PACKAGES)
        if there.get(name) != here[name]
    ]
    if differ:
        return (
            f"{pc.host}: versions differ from this PC's: {', '.join(differ)}: install the same kit"
        )
    return None


def check_pcs(hosts: LabHosts, timeout: float = 30.0) -> list[str]:
    """Ask every PC of ``hosts`` at once; return one line per PC that is not ready (empty: all)."""
    here = versions_here()
    with ThreadPoolExecutor(max_workers=min(16, len(hosts.pcs))) as pool:
        lines = pool.map(lambda pc: _check_one(hosts, pc, here, timeout), hosts.pcs)
    return [line for line in lines if line]


def leftover_controllers(profile_dir: str) -> list[int]:
    """Return the pids of controllers of ``profile_dir`` still running on this PC."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "ipyparallel.controller" not in cmd and "ipcontroller" not in cmd:
                continue
            # ipyparallel hands the controller its profile in the environment, not the argv.
            if proc.environ().get("IPP_PROFILE_DIR") == profile_dir:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids
