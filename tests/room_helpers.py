"""No lecture (the tests). What the room tests share: run ``./kit`` in a room's environment, list a namespace's processes."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "kit", "kit_after", "pids_in"]

ROOT = Path(__file__).resolve().parents[1]


def kit(env: dict[str, str], *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m course_kit.jobs.cluster ARGV`` (what ``./kit ARGV`` runs)."""
    return subprocess.run(
        [sys.executable, "-m", "course_kit.jobs.cluster", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def kit_after(timeout: float):  # noqa: ANN201 - a partial of kit
    """Return :func:`kit` with another default ``timeout`` (a slower job's)."""
    return functools.partial(kit, timeout=timeout)


def pids_in(netns: str) -> list[int]:
    """Return the pids of the processes in network namespace ``netns`` (none when it is gone)."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]
