"""The emulated room (docs/instructor.md's rehearsal; lecture 3's links): ``ssh`` and ``scp`` stand-ins that reach the emulated room's PCs, for the lab's launcher.

``./kit lab start`` starts engines through ipyparallel's SSH launcher, which runs
``ssh HOST COMMAND`` and ``scp FILE HOST:PATH``. In the emulated room the PCs are network
namespaces on this machine, so the stand-in ``ssh`` runs COMMAND with ``bash -c`` inside HOST's
namespace (its own host name, from the home folder, as sshd would), and ``scp`` copies the file
(every PC shares this machine's disk). The launcher's own code runs unchanged: the hosts file
names the stand-ins under ``[ssh] command`` and ``scp``. As a real ``ssh`` does, the stand-in
fails with exit 255 when the PC cannot be reached: here, when its link is down (``ip link set
VETH down`` on the instructor's side of its cable).

:func:`write_lab_files` writes both stand-ins and a hosts file for the room, which is what
``./kit room up N`` leaves for ``./kit lab start``: a rehearsal uses the lab's own commands.
"""

from __future__ import annotations

import shlex
import stat
import sys
from pathlib import Path

from course_kit.room.build import Room

__all__ = ["write_lab_files", "write_ssh_standins"]

_SKIP_OPTIONS = """while [ $# -gt 0 ]; do
    case "$1" in
        -p|-P|-i|-o|-l|-F) shift 2 ;;
        --) shift; break ;;
        -*) shift ;;
        *) break ;;
    esac
done
"""

_SSH = """#!/bin/sh
# ssh stand-in for the emulated room {tag}: ssh [OPTIONS] [USER@]HOST COMMAND...
{skip}host=${{1#*@}}; shift
case "$host" in
{cases}
    *) echo "ssh stand-in: no PC '$host' in room {tag}" >&2; exit 255 ;;
esac
if [ "$(cat /sys/class/net/$veth/operstate 2>/dev/null)" != up ]; then
    echo "ssh: connect to host $host port 22: No route to host" >&2; exit 255
fi
exec ip netns exec "$ns" unshare --uts sh -c \\
    'hostname "$0" && cd "$HOME" && exec bash -c "$1"' "$name" "$*"
"""

_SCP = """#!/bin/sh
# scp stand-in for the emulated room {tag}: scp [OPTIONS] SRC DST, either one HOST:PATH
{skip}local_path() {{
    case "$1" in
        /*) echo "$1" ;;
        *:*) p=${{1#*:}}; case "$p" in /*) echo "$p" ;; *) echo "$HOME/$p" ;; esac ;;
        *) echo "$1" ;;
    esac
}}
src=$(local_path "$1"); dst=$(local_path "$2")
[ "$(realpath -m "$src")" = "$(realpath -m "$dst")" ] && exit 0
exec cp -- "$src" "$dst"
"""


def write_ssh_standins(room: Room, folder: Path) -> tuple[Path, Path]:
    """Write ``ssh`` and ``scp`` stand-ins for ``room`` into ``folder``; return their paths."""
    cases = []
    for pc in room.pcs:
        names = " | ".join(shlex.quote(n) for n in dict.fromkeys((pc.hostname, pc.ip, pc.netns)))
        cases.append(
            f"    {names}) ns={shlex.quote(pc.netns)}; name={shlex.quote(pc.hostname)}; "
            f"veth={shlex.quote(pc.host_veth)} ;;"
        )
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, template in (("ssh", _SSH), ("scp", _SCP)):
        path = folder / name
        path.write_text(template.format(tag=room.tag, skip=_SKIP_OPTIONS, cases="\n".join(cases)))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        paths.append(path)
    return paths[0], paths[1]


def write_lab_files(
    room: Room,
    folder: Path,
    engines: int = 1,
    profile: str = "lab",
    mpi_ranks: int = 0,
    seat: int | None = None,
) -> Path:
    """Write the stand-ins and ``hosts.toml`` (``engines`` per PC, ``mpi_ranks`` MPI engines,
    ``seat`` engines per student's seat) for ``room``; return the file."""
    ssh, scp = write_ssh_standins(room, folder / "bin")
    pcs = "".join(f'\n[[pc]]\nhost = "{pc.hostname}"\n' for pc in room.pcs)
    mpi = f"[mpi]\nranks = {mpi_ranks}\n\n" if mpi_ranks else ""
    hosts = folder / "hosts.toml"
    hosts.write_text(
        f"# The emulated room {room.tag} as a lab: ./kit lab start {hosts}\n"
        f'[controller]\nip = "{room.instructor_ip}"\nprofile = "{profile}"\n'
        + (f"seat = {seat}\n" if seat else "")
        + "\n"
        f'[defaults]\npython = "{sys.executable}"\nengines = {engines}\n\n'
        f'{mpi}[ssh]\ncommand = ["{ssh}"]\nscp = ["{scp}"]\n{pcs}'
    )
    return hosts
