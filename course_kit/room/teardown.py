"""The emulated room (docs/instructor.md's rehearsal; lecture 3's links): Removing an emulated room: stop what runs in its PCs, delete only what it created.

:func:`teardown_room` tries every step and returns what could not be removed, so a room that
half failed to build, or one whose processes hang, is still cleaned up as far as it can be.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

from course_kit.room.namespaces import Room, run_or_raise

__all__ = ["leftovers", "teardown_room"]


def _kill_namespace_processes(room: Room, grace: float = 3.0) -> None:
    """Stop what the room started (by pid), then anything else left in its namespaces."""
    pids: set[int] = set()
    for proc in room.procs:
        if proc.poll() is None:
            pids.add(proc.pid)
    for pc in (pc for pc in room.pcs if pc.netns in room.created):
        # Processes a command forked (an engine's children) live in the namespace too.
        done = subprocess.run(["ip", "netns", "pids", pc.netns], capture_output=True, text=True)
        pids.update(int(p) for p in done.stdout.split() if p.strip().isdigit())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        for proc in room.procs:  # reap our own children, or they stay as zombies
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        pids = {pid for pid in pids if _alive(pid)}
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def teardown_room(room: Room) -> list[str]:
    """Remove everything ``room`` created, and stop what runs in its PCs; return what is left.

    Only names in ``room.created`` are deleted (never a stranger's with a clashing name); every
    step is tried, and the returned list says what could not be removed (empty: all gone).
    """
    errors = []
    steps = [lambda: _kill_namespace_processes(room)]
    ours = [name for name in room.names if name in room.created]  # never a clashing stranger
    for pc in room.pcs:
        # Deleting the namespace destroys the veth end inside it, and with it the pair; the
        # host end is deleted by hand only if the namespace never got its end.
        if pc.netns in ours:
            steps.append(functools.partial(_delete, "netns", pc.netns))
            steps.append(functools.partial(shutil.rmtree, f"/etc/netns/{pc.netns}", True))
    veths = [pc.host_veth for pc in room.pcs if pc.host_veth in ours]
    steps.append(lambda: _wait_until_gone(veths, within=2.0))
    steps += [functools.partial(_delete, "link", veth) for veth in veths]
    if room.bridge in ours:
        steps.append(functools.partial(_delete, "link", room.bridge))
    steps.append(_remove_netns_folder_if_empty)
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - every other step must still run
            errors.append(f"{type(exc).__name__}: {exc}")
    errors += [f"left behind: {name}" for name in _wait_until_gone(ours)]
    return errors


def _remove_netns_folder_if_empty() -> None:
    with contextlib.suppress(OSError):  # not empty: another room (or the admin) uses it
        os.rmdir("/etc/netns")


def _delete(kind: str, name: str) -> None:
    """Delete namespace or link ``name`` if it exists (it may vanish meanwhile: that is fine)."""
    if name in leftovers([name]):
        done = subprocess.run(["ip", kind, "del", name], capture_output=True, text=True)
        if done.returncode != 0 and name in leftovers([name]):
            raise RuntimeError(f"`ip {kind} del {name}` failed: {done.stderr.strip()}")


def _wait_until_gone(names: Sequence[str], within: float = 5.0) -> list[str]:
    """Return those of ``names`` still present after ``within`` seconds."""
    # The kernel destroys a namespace, and the veth pair inside it, after `ip netns del`
    # returns, so the host end of a pair disappears a moment later.
    deadline = time.monotonic() + within
    while (left := leftovers(names)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def leftovers(names: Sequence[str]) -> list[str]:
    """Return those of ``names`` that still exist as a network namespace or a link."""
    namespaces = {
        line.split()[0] for line in run_or_raise("ip", "netns", "list").splitlines() if line
    }
    links = set()
    for line in run_or_raise("ip", "-o", "link").splitlines():
        links.add(line.split(":")[1].strip().split("@")[0])
    return [name for name in names if name in namespaces or name in links]
