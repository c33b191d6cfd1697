"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): wait for a process that ``lab stop`` ended, a zombie counting as ended.

``lab stop`` ends processes that an earlier ``./kit lab start`` left running (the seat service,
the MPI world's ``mpiexec``, a controller the launcher could not stop). They are not its children:
once they exit they stay zombies until the system's init reaps them, and psutil's ``wait`` waits
for that. A container's init may reap only every second or two (1.4 s measured on the test
machine), or never (a container started without an init), and ``lab stop`` waited that long, or
its whole timeout, on each.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

__all__ = ["wait_ended"]


def wait_ended(process: Any, timeout: float) -> bool:
    """Wait up to ``timeout`` s for psutil ``process`` to end (or be a zombie); True if it did."""
    import psutil

    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                with contextlib.suppress(OSError):  # reaped here when it is this process's child
                    os.waitpid(process.pid, os.WNOHANG)
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.1)
