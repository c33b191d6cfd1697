"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): the lab's engines started with one SSH round trip per PC, every PC at once.

ipyparallel's ``SSHEngineSetLauncher`` starts engines one after another, and for each engine asks
the PC for its shell and its Python, creates the remote profile, copies the connection file and
starts the engine: six round trips over SSH an engine, several of them starting Python on the PC,
and a watcher per engine that starts Python on the PC every few seconds. For 4 PCs × 2 engines
that was 64 s of silence before the first engine registered (load 8 on 2 cores).

Here each PC gets one SSH round trip: a short script on Python's standard input starts the PC's
engines detached (the controller's connection info in their environment, ``IPP_CONNECTION_INFO``,
so nothing is copied) and prints their pids; the PCs start at once, each in a thread, and a line
is reported as each PC's engines are launched. ``signal`` and ``stop`` are one round trip per PC
too (TERM, wait on the PC, KILL what still runs). A dead engine is noticed by the controller's
heartbeat (:mod:`course_kit.lab.roster`), not by a watcher per engine. The script runs under
whatever shell the PC's SSH server starts (``python -`` reads it from standard input), so a
Windows PC with OpenSSH server runs it as a Linux PC does. Each engine's output goes to a file in
the PC's temporary folder (``course-lab/engine-*.log``), for when an engine never registers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ipyparallel.cluster.launcher import EngineLauncher
from traitlets import Any as AnyTrait
from traitlets import Dict, Float, List, Unicode

__all__ = ["PCEngine", "PCEngineSetLauncher", "on_every_pc"]

PIDS_TAG = "COURSE-LAB-PIDS "  # the line the PC's script answers with

# Run on a PC by ``python -``: start ARGS["n"] engines detached; print their pids.
_START = """\
import json, os, subprocess, sys, tempfile, time
ARGS = json.loads({args!r})
env = dict(os.environ, **ARGS["env"])
logs = os.path.join(tempfile.gettempdir(), "course-lab")
os.makedirs(logs, exist_ok=True)
pids = []
for i in range(ARGS["n"]):
    log = open(os.path.join(logs, "engine-%d-%d.log" % (time.time(), i)), "ab")
    kw = dict(stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, close_fds=True)
    if os.name == "nt":
        kw["creationflags"] = 0x00000008 | 0x00000200  # DETACHED_PROCESS | NEW_PROCESS_GROUP
    else:
        kw["start_new_session"] = True  # outlives this script and the SSH session
    pids.append(subprocess.Popen(ARGS["cmd"], **kw).pid)
print({tag!r} + json.dumps(pids), flush=True)
"""

# Run on a PC by ``python -``: send ARGS["sig"] to ARGS["pids"] (0: none), wait up to
# ARGS["wait"] s for them to end; print the pids still running.
_SIGNAL = """\
import json, os, time
ARGS = json.loads({args!r})
def alive(pid):
    if os.name == "nt":  # os.kill(pid, 0) would terminate a process on Windows
        import ctypes
        handle = ctypes.windll.kernel32.OpenProcess(0x1000, False, pid)
        code = ctypes.c_ulong()
        ok = handle and ctypes.windll.kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
        return bool(ok) and code.value == 259  # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # an engine that ended but was not reaped yet is a zombie: gone
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
left = [p for p in ARGS["pids"] if alive(p)]
for p in left:
    if ARGS["sig"]:
        try:
            os.kill(p, ARGS["sig"])
        except OSError:
            pass
deadline = time.monotonic() + ARGS["wait"]
while left and time.monotonic() < deadline:
    time.sleep(0.1)
    left = [p for p in left if alive(p)]
print({tag!r} + json.dumps(left), flush=True)
"""


def on_every_pc(work: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Run each PC's ``work`` at once (a thread per PC); return its results by PC (an exception for a failure)."""
    if not work:
        return {}
    results: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=min(32, len(work))) as pool:
        futures = {host: pool.submit(job) for host, job in work.items()}
        for host, future in futures.items():
            try:
                results[host] = future.result()
            except Exception as exc:  # noqa: BLE001 - reported per PC by the caller
                results[host] = exc
    return results


def _run_on(ssh: list[str], host: str, python: str, script: str, timeout: float) -> list[int]:
    """Run ``script`` with ``python -`` on ``host`` over ``ssh``; return the pids it printed."""
    done = subprocess.run(
        [*ssh, host, python, "-"], input=script, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith(PIDS_TAG):
            return [int(pid) for pid in json.loads(line[len(PIDS_TAG) :])]
    why = " ".join((done.stderr or done.stdout).split())[-300:] or f"exit status {done.returncode}"
    raise RuntimeError(f"{host}: {why}")


@dataclass
class PCEngine:
    """One PC's engines as the kit's lab code sees a launcher: where, which pids, running or not."""

    location: str
    pids: list[int]
    owner: PCEngineSetLauncher
    state: str = "running"

    def signal(self, sig: int, keep: set[int] = frozenset()) -> None:
        """Send ``sig`` to this PC's engines but ``keep`` (one SSH round trip); forget those that ended."""
        self.pids = self.owner.signal_pc(self.location, sig, wait=0.0, keep=keep)
        self.state = "running" if self.pids else "after"


class PCEngineSetLauncher(EngineLauncher):
    """Engines on the lab's PCs over SSH: one round trip per PC to start, signal or stop, PCs at once."""

    entrypoint_name = "course_kit.lab.launcher.PCEngineSetLauncher"  # how the cluster file names it
    engines = Dict(config=True, help="PC -> {n, remote_python, engine_cmd}").tag(to_dict=True)
    ssh_cmd = List(["ssh"], config=True).tag(to_dict=True)
    pids = Dict(help="PC -> pids of its engines").tag(to_dict=True)
    ssh_timeout = Float(120.0, config=True, help="seconds one PC may take to answer")
    stop_seconds_until_kill = Float(5.0, config=True)
    remote_profile_dir = Unicode("").tag(to_dict=True)
    progress = AnyTrait(None, allow_none=True).tag(config=True)  # a callable taking one line
    started_at = Float(0.0, config=True, help="time.monotonic() the caller's lines count from")

    @property
    def launchers(self) -> dict[str, PCEngine]:
        """One entry per PC (the kit's lab code signals a PC's engines through it)."""
        return {host: PCEngine(host, list(pids), self) for host, pids in self.pids.items()}

    def find_args(self) -> list[str]:
        """The SSH command (for ipyparallel's logs)."""
        return list(self.ssh_cmd)

    def _profile_on_pc(self) -> str:
        """The profile folder as the PC sees it: the home folder's part stripped (as ipyparallel does)."""
        home = os.path.expanduser("~").rstrip("/") + "/"
        return (
            self.profile_dir[len(home) :] if self.profile_dir.startswith(home) else self.profile_dir
        )

    def start(self, n: int) -> list[str]:
        """Start up to ``n`` engines over the PCs of ``engines``, every PC at once; return the PCs."""
        started, plan, left = self.started_at or time.monotonic(), {}, n
        env = dict(self.get_env(), IPP_PROFILE_DIR=self._profile_on_pc())
        for host, config in self.engines.items():
            count = min(int(config.get("n", 1)) if isinstance(config, dict) else int(config), left)
            if count > 0:
                plan[host] = config if isinstance(config, dict) else {}
                plan[host] = dict(plan[host], n=count)
                left -= count
        scripts = {
            host: _START.format(
                tag=PIDS_TAG,
                args=json.dumps({"n": c["n"], "env": env, "cmd": self._engine_cmd(c)}),
            )
            for host, c in plan.items()
        }

        def start_pc(host: str) -> list[int]:
            pids = _run_on(
                self.ssh_cmd, host, self._python(plan[host]), scripts[host], self.ssh_timeout
            )
            if self.progress is not None:
                self.progress(
                    f"lab start: {host}: {len(pids)} engine{'s' * (len(pids) != 1)} launched "
                    f"({time.monotonic() - started:.0f} s)"
                )
            return pids

        results = on_every_pc({host: (lambda h=host: start_pc(h)) for host in plan})
        self.pids = {host: pids for host, pids in results.items() if isinstance(pids, list)}
        self.notify_start({"pids": self.pids})
        failed = {host: exc for host, exc in results.items() if isinstance(exc, Exception)}
        if failed:
            raise RuntimeError("; ".join(f"{exc}" for exc in failed.values()))
        self.n = sum(len(p) for p in self.pids.values())
        return list(self.pids)

    @staticmethod
    def _python(config: dict) -> str:
        return str(config.get("remote_python", "python3"))

    def _engine_cmd(self, config: dict) -> list[str]:
        return list(config.get("engine_cmd") or [self._python(config), "-m", "ipyparallel.engine"])

    def signal_pc(self, host: str, sig: int, wait: float) -> list[int]:
        """Send ``sig`` to ``host``'s engines and wait up to ``wait`` s; return the pids still running."""
        script = _SIGNAL.format(
            tag=PIDS_TAG,
            args=json.dumps({"pids": self.pids.get(host, []), "sig": sig, "wait": wait}),
        )
        left = _run_on(
            self.ssh_cmd, host, self._python(self.engines.get(host, {})), script, self.ssh_timeout
        )
        self.pids = {**self.pids, host: left}
        return left

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every PC's engines at once."""
        on_every_pc(
            {host: (lambda h=host: self.signal_pc(h, sig, 0.0)) for host in list(self.pids)}
        )

    async def stop(self) -> None:
        """TERM every PC's engines at once and wait on the PCs; KILL what still runs; notify the stop."""

        def stop_all() -> None:
            for sig, wait in (
                (signal.SIGTERM, self.stop_seconds_until_kill),
                (signal.SIGKILL, 5.0),
            ):
                hosts = [host for host, pids in self.pids.items() if pids]
                on_every_pc(
                    {h: (lambda h=h, s=sig, w=wait: self.signal_pc(h, s, w)) for h in hosts}
                )

        await asyncio.get_running_loop().run_in_executor(None, stop_all)
        self.notify_stop({"exit_code": 0, "pids": self.pids})

    async def join(self, timeout: float | None = None) -> None:
        """Wait until no engine of this set runs (checked on every PC at once)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(self.pids.values()):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"engines still running: {self.pids}")
            self.signal(0)
            await asyncio.sleep(0.5)
