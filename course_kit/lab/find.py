"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): Find the lab clusters that run on this PC, without their hosts file: bare ``./kit lab status``.

``./kit lab start HOSTS`` leaves a controller per profile (ipyparallel's ``cluster-.json`` names
its pid) and the roster of engines; it also notes which hosts file it starts from
(``lab-hosts-path``, written before the start: a note left by a failed start is never read, since
only a running controller counts), so ``status`` shows the full per-PC table without the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOSTS_NOTE", "RunningLab", "remember_hosts_file", "running_labs"]

HOSTS_NOTE = "lab-hosts-path"  # in the profile's security folder, beside lab-roster.json


@dataclass(frozen=True)
class RunningLab:
    """A lab cluster's controller that runs here: its profile, pid and hosts file (if noted)."""

    profile: str
    pid: int
    hosts_file: Path | None


def _ipython_dir() -> Path:
    from IPython.paths import get_ipython_dir

    return Path(get_ipython_dir())


def remember_hosts_file(profile: str, hosts_file: Path) -> None:
    """Note in the profile's security folder the hosts file its lab cluster starts from.

    Called before the start; where a lab cluster already runs in the profile (the start will
    refuse), its note is left as it is.
    """
    if any(lab.profile == profile for lab in running_labs()):
        return
    security = _ipython_dir() / f"profile_{profile}" / "security"
    security.mkdir(mode=0o700, parents=True, exist_ok=True)  # IPython's own mode for it
    (security / HOSTS_NOTE).write_text(str(Path(hosts_file).resolve()) + "\n")


def _controller_pid(state: Path) -> int | None:
    """Return the pid of the lab controller that ``state`` describes when it runs, else None."""
    import psutil

    try:
        data = json.loads(state.read_text())
        pid = int(data["controller"]["state"]["pid"])
        is_lab = "ssh" in str(data.get("engines", {}).get("class", "")).lower()
        if not (is_lab or (state.parent / "lab-roster.json").is_file()):
            return None
        return pid if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else None
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None


def running_labs() -> list[RunningLab]:
    """Return every lab cluster whose controller runs on this PC (any profile)."""
    labs = []
    for state in sorted(_ipython_dir().glob("profile_*/security/cluster-.json")):
        pid = _controller_pid(state)
        if pid is None:
            continue
        note = state.parent / HOSTS_NOTE
        hosts = Path(note.read_text().strip()) if note.is_file() else None
        profile = state.parent.parent.name.removeprefix("profile_")
        labs.append(RunningLab(profile, pid, hosts if hosts and hosts.is_file() else None))
    return labs
