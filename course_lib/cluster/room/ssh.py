"""``ssh`` and ``scp`` stand-ins that reach the emulated room's PCs, for the lab's launcher.

``./kit lab start`` starts engines through ipyparallel's SSH launcher, which runs
``ssh HOST COMMAND`` and ``scp FILE HOST:PATH``. In the emulated room the PCs are network
namespaces on this machine, so the stand-in ``ssh`` runs COMMAND with ``bash -c`` inside HOST's
namespace (its own host name, from the home folder, as sshd would), and ``scp`` copies the file
(every PC shares this machine's disk). The launcher's own code runs unchanged: the hosts file
names the stand-ins under ``[ssh] command`` and ``scp``.
"""

from __future__ import annotations

import shlex
import stat
from pathlib import Path

from course_lib.cluster.room.build import Room

__all__ = ["write_ssh_standins"]

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
        cases.append(f"    {names}) ns={shlex.quote(pc.netns)}; name={shlex.quote(pc.hostname)} ;;")
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, template in (("ssh", _SSH), ("scp", _SCP)):
        path = folder / name
        path.write_text(template.format(tag=room.tag, skip=_SKIP_OPTIONS, cases="\n".join(cases)))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        paths.append(path)
    return paths[0], paths[1]
