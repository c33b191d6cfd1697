"""No lecture (the grader). A sandbox's share of the machine: a control group of its own, made and removed by the grader.

A notebook's processes compete for the cores one by one: an answer that starts a few hundred
busy processes would take as many shares of the CPU as it has processes, and starve the honest
notebook graded beside it past its time limit. So each sandbox's processes go into a control
group of their own (made by the grader before the kernel starts, joined by the sandbox's
launcher before it forks, removed after the run with whatever is left in it), with

- the same CPU weight as every other sandbox (``cpu.weight`` 400 in cgroup v2, ``cpu.shares``
  4096 in v1): two notebooks on one core get half each, however many processes either starts;
  against processes outside any sandbox, a sandbox weighs as four busy processes (the engines
  of the largest assignment), so on a loaded machine it keeps about the share it had before;
- at most ``cpus`` cores (``cpu.max`` / ``cpu.cfs_quota_us``);
- a memory limit for the whole sandbox (``memory.max`` / ``memory.limit_in_bytes``), beside the
  per-process address-space limit.

Where no control group can be made (not root, ``/sys/fs/cgroup`` read-only, a kernel without
the controllers) the sandbox runs without a share of its own: :func:`cgroup_problem` says why,
the grader prints it once, and the per-process limits (rlimits) still hold.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CGROUP_ROOT", "cgroup_problem", "sandbox_cgroup"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000
_PREFIX = "course-sandbox-"
_WEIGHT = 4 * 1024  # four busy processes' worth (v1 shares; v2's weight is 400)


def _own_path(controller: str) -> str:
    """This process's cgroup for ``controller`` ("" for v2), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(",") or (controller == "" and names == ""):
            return path
    return "/"


def _v2_base() -> Path | None:
    """The cgroup v2 folder to make sandboxes in, with cpu and memory enabled below it."""
    for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        controllers = mount / "cgroup.controllers"
        if not controllers.exists() or not {"cpu", "memory"} <= set(
            controllers.read_text().split()
        ):
            continue
        base = mount / _own_path("").lstrip("/") / "course-grader"
        base.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text("+cpu +memory")
        return base
    return None


def _v1_bases() -> dict[str, Path]:
    """The cgroup v1 folders (cpu, memory) to make sandboxes in, under this process's own."""
    bases = {}
    for controller in ("cpu", "memory"):
        for mount in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
            if controller in mount.name.split(",") and (mount / "cgroup.procs").exists():
                bases[controller] = mount / _own_path(controller).lstrip("/")
                break
    return bases if set(bases) == {"cpu", "memory"} else {}


def _sweep(base: Path) -> None:
    """Remove the empty sandbox groups a grader that was killed left (a minute old at least:
    a group just made is empty until its launcher joins it; one in use cannot be removed)."""
    for group in base.glob(f"{_PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - group.stat().st_mtime > 60:
                group.rmdir()


def _make(cpus: float, memory_mb: int) -> list[Path]:
    """Make one sandbox's control group(s); return their folders (the v2 one, or v1's cpu, memory)."""
    name = f"{_PREFIX}{uuid.uuid4().hex[:12]}"
    base = _v2_base()
    for folder in [base] if base is not None else _v1_bases().values():
        _sweep(folder)
    if base is not None:
        group = base / name
        group.mkdir()
        (group / "cpu.weight").write_text(str(_WEIGHT // 1024 * 100))
        (group / "cpu.max").write_text(f"{int(cpus * _PERIOD_US)} {_PERIOD_US}")
        (group / "memory.max").write_text(str(memory_mb * 2**20))
        return [group]
    bases = _v1_bases()
    if not bases:
        raise OSError("no cgroup v2 with cpu and memory, nor cgroup v1 cpu and memory controllers")
    cpu, memory = bases["cpu"] / name, bases["memory"] / name
    made = []
    try:
        for group in (cpu, memory):
            group.mkdir()
            made.append(group)
        (cpu / "cpu.shares").write_text(str(_WEIGHT))
        (cpu / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(cpus * _PERIOD_US)))
        (memory / "memory.limit_in_bytes").write_text(str(memory_mb * 2**20))
    except OSError:
        _remove(made)
        raise
    return made


def _remove(groups: list[Path]) -> None:
    """Kill whatever is left in ``groups`` and remove them (empty control groups only go)."""
    for group in groups:
        for _ in range(50):
            try:
                pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            except OSError:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)


@functools.lru_cache(maxsize=1)
def cgroup_problem() -> str | None:
    """Why sandboxes get no control group here (None when they do): tried once, made and removed."""
    if os.geteuid() != 0:
        return "the grader is not root, so it cannot make control groups"
    try:
        _remove(_make(1.0, 64))
    except OSError as exc:
        return f"no control group could be made under {CGROUP_ROOT} ({exc})"[:200]
    return None


@contextlib.contextmanager
def sandbox_cgroup(cpus: float, memory_mb: int) -> Iterator[list[str]]:
    """A sandbox's control group(s) for the block: yield the ``cgroup.procs`` files its
    launcher joins ([] where :func:`cgroup_problem`); then kill what is left and remove them."""
    if cgroup_problem() is not None:
        yield []
        return
    groups = _make(cpus, memory_mb)
    try:
        yield [str(group / "cgroup.procs") for group in groups]
    finally:
        _remove(groups)
