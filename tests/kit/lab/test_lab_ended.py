"""No lecture (the tests). ``lab stop``'s wait for a process it ended: a zombie counts as ended."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from course_kit.lab.ended import wait_ended

#: A parent that never reaps its child: once killed, the child stays a zombie (as an orphan does
#: until a slow init reaps it).
NEGLECTFUL = (
    "import subprocess, time; print(subprocess.Popen(['sleep', '60']).pid, flush=True); "
    "time.sleep(60)"
)


def test_a_zombie_counts_as_ended_a_child_is_reaped_a_live_process_is_not() -> None:
    parent = subprocess.Popen([sys.executable, "-c", NEGLECTFUL], stdout=subprocess.PIPE, text=True)
    try:
        zombie = psutil.Process(int(parent.stdout.readline()))
        zombie.kill()
        started = time.monotonic()
        assert wait_ended(zombie, 30)  # psutil's own wait would wait the 30 s out
        assert time.monotonic() - started < 20
    finally:
        parent.kill()
        parent.wait()
    # This process's own child is reaped, not left a zombie.
    child = subprocess.Popen(["sleep", "60"])
    psutil.Process(child.pid).kill()
    assert wait_ended(psutil.Process(child.pid), 30)
    assert not psutil.pid_exists(child.pid)
    # A process that runs on: False once the timeout has passed.
    live = subprocess.Popen(["sleep", "60"])
    try:
        started = time.monotonic()
        assert not wait_ended(psutil.Process(live.pid), 0.3)
        assert time.monotonic() - started >= 0.3
    finally:
        live.kill()
        live.wait()
