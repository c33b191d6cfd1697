"""The emulated room (docs/instructor.md's rehearsal; lecture 3's links): A persistent emulated room: ``./kit room up N`` builds it, ``down`` removes it, ``status``.

An instructor rehearses a class on one machine: ``up`` builds the same room as
:func:`course_kit.room.build.emulated_room` (one implementation, :func:`build_room`) but leaves
it up when the command exits, and records what it created (namespaces, veths, bridge, subnet)
in a state file, written atomically. ``down`` removes exactly those objects (and stops what
still runs inside the PCs), so a second ``down`` finds nothing and says so. The names are
recorded *before* anything is built, so a killed ``up`` still leaves ``down`` what to remove.

The state file is the checkout's ``.kit/room.json`` (``$COURSE_ROOM_STATE`` or ``--state``
moves it). Network namespaces do not survive a reboot; a state file whose objects are all gone
is stale, and ``status`` / ``up`` say so and replace it.

``up`` also writes what ``./kit lab start`` needs to reach the room's PCs: a hosts file and the
``ssh`` / ``scp`` stand-ins (:func:`course_kit.room.ssh.write_lab_files`), in the folder
beside the state file (``.kit/room-lab/``); ``down`` removes them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import course_lib
from course_kit.room.build import (
    BURST,
    PC,
    Room,
    build_room,
    leftovers,
    missing_prerequisite,
    teardown_room,
)
from course_kit.room.slurm import PARTITION, slurm_down, slurm_unavailable_reason, slurm_up
from course_kit.room.ssh import write_lab_files

__all__ = [
    "RoomError",
    "default_state_file",
    "describe_room",
    "lab_folder",
    "read_state",
    "room_down",
    "room_up",
    "pc_command",
    "write_slurm_lab",
]

ENV_VAR = "COURSE_ROOM_STATE"
RATE = re.compile(r"^\d+(\.\d+)?([kmgt]i?)?(bit|bps)$", re.IGNORECASE)  # tc's rate syntax


class RoomError(RuntimeError):
    """A room cannot be built, found or removed here; the message names the fix."""


def default_state_file() -> Path:
    """Return where the room's state is kept: ``$COURSE_ROOM_STATE``, else ``.kit/room.json``."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return Path(course_lib.__file__).resolve().parent.parent / ".kit" / "room.json"


def lab_folder(state_file: Path) -> Path:
    """Return where ``up`` writes the room's hosts file and SSH stand-ins (beside the state)."""
    return state_file.with_name(f"{state_file.stem}-lab")


def _write_state(path: Path, room: Room, burst: str) -> None:
    """Write ``room`` to ``path`` atomically (temp file, fsync, rename, fsync the folder)."""
    state = {
        "format": 1,
        "tag": room.tag,
        "subnet": room.subnet,
        "bridge": room.bridge,
        "instructor_ip": room.instructor_ip,
        "rate": room.rate,
        "burst": burst,
        "pcs": [vars(pc) for pc in room.pcs],
        "created": sorted(room.created),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(tmp, "w") as handle:
        json.dump(state, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_state(path: Path | None = None) -> Room | None:
    """Return the room recorded in the state file, or None when there is none."""
    path = path or default_state_file()
    try:
        state = json.loads(path.read_text())
        return Room(
            tag=state["tag"],
            subnet=state["subnet"],
            bridge=state["bridge"],
            instructor_ip=state["instructor_ip"],
            rate=state["rate"],
            pcs=[PC(**pc) for pc in state["pcs"]],
            created=set(state["created"]),
        )
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise RoomError(
            f"the room state file {path} is unreadable ({type(exc).__name__}: {exc}); if no "
            f"room is up, delete it (`ip netns list` shows the PCs of a room still up)"
        ) from None


def _planned(n_pcs: int, tag: str, rate: str) -> Room:
    """Return the room ``build_room(n_pcs, tag=tag)`` will create, every name marked created."""
    pcs = [
        PC(netns=f"pc{k}_{tag}", hostname=f"pc{k}-{tag}", ip="", host_veth=f"rv{tag}p{k}")
        for k in range(1, n_pcs + 1)
    ]
    room = Room(tag=tag, subnet="", bridge=f"rbr{tag}", instructor_ip="", rate=rate, pcs=pcs)
    room.created = set(room.names)
    return room


def room_up(
    n_pcs: int,
    rate: str = "1gbit",
    state_file: Path | None = None,
    engines: int = 1,
    mpi_ranks: int = 0,
    seat: int | None = None,
    slurm: bool = False,
) -> Room:
    """Build a room of ``n_pcs`` PCs that stays up, record it in the state file; return it.

    Also writes the hosts file (``engines`` per PC, ``mpi_ranks`` engines that are MPI ranks)
    and SSH stand-ins for ``./kit lab start`` into :func:`lab_folder`; with ``slurm``, also a
    real Slurm across the PCs and its lab file ``slurm.toml`` there
    (:mod:`course_kit.room.slurm`).
    """
    if not 1 <= n_pcs <= 200:
        raise ValueError(f"{n_pcs} PCs: give a number of PCs from 1 to 200")
    if not 1 <= engines <= 64:
        raise ValueError(f"--engines {engines}: give 1 to 64 engines per PC")
    if not 0 <= mpi_ranks <= n_pcs * engines:
        raise ValueError(
            f"--mpi-ranks {mpi_ranks}: give 0 to {n_pcs * engines} (one per engine slot)"
        )
    if not RATE.match(rate):
        raise ValueError(f"rate {rate!r}: give a tc rate such as 1gbit, 100mbit or 12.5mbps")
    if (missing := missing_prerequisite()) is not None:
        raise RoomError(missing)
    if slurm and (missing := slurm_unavailable_reason()) is not None:
        raise RoomError(missing)
    path = state_file or default_state_file()
    if (old := read_state(path)) is not None:
        if leftovers(old.names):
            raise RoomError(
                f"a room of {len(old.pcs)} PCs ({old.subnet}) is already up (state {path}): "
                f"run `./kit room down` first"
            )
        path.unlink()  # stale: its namespaces are gone (a reboot)
    # Letters, then one digit: every room's host names (pc1-kqzrtx7) have the shape of a lab's
    # "lab2-pc07" that MPICH's own Slurm node-list parser fails on (course_kit/lab/slurm_hosts.py).
    tag = "k" + "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5))
    tag += secrets.choice("0123456789")
    _write_state(path, _planned(n_pcs, tag, rate), BURST)  # so a killed `up` can be undone
    try:
        room = build_room(n_pcs, rate, BURST, tag=tag)
    except Exception as exc:
        path.unlink(missing_ok=True)  # build_room removed what it had built
        raise RoomError(f"building the room failed: {exc}") from None
    _write_state(path, room, BURST)
    write_lab_files(room, lab_folder(path), engines=engines, mpi_ranks=mpi_ranks, seat=seat)
    if slurm:
        try:
            write_slurm_lab(room, lab_folder(path), engines)
        except Exception as exc:
            room_down(path)
            raise RoomError(
                f"starting Slurm in the room failed (the room is removed): {exc}"
            ) from None
    return room


def write_slurm_lab(room: Room, folder: Path, tasks_per_node: int = 1) -> Path:
    """Start Slurm across ``room`` (its files in ``folder/slurm``); write ``slurm.toml``, return it."""
    slurm_folder = folder / "slurm"
    env = slurm_up(room, slurm_folder)
    lab = folder / "slurm.toml"
    lab.write_text(
        f"# The emulated room {room.tag}'s Slurm as a lab: ./kit lab start {lab}\n"
        f'[controller]\nip = "{room.instructor_ip}"\nprofile = "slurm"\n\n'
        f'[slurm]\npartition = "{PARTITION}"\nnodes = {len(room.pcs)}\n'
        f'tasks_per_node = {tasks_per_node}\ntime = "01:00:00"\npython = "{sys.executable}"\n'
        f'conf = "{env["SLURM_CONF"]}"\npending_limit = 120\n'
    )
    return lab


def room_down(state_file: Path | None = None) -> tuple[Room | None, list[str]]:
    """Remove the recorded room; return it (None: nothing was up) and what could not go."""
    path = state_file or default_state_file()
    room = read_state(path)
    if room is None:
        return None, []
    if (missing := missing_prerequisite()) is not None:
        raise RoomError(missing)
    errors = slurm_down(lab_folder(path) / "slurm")  # its daemons first: slurmd runs in the PCs
    errors += teardown_room(room)
    if not errors:
        path.unlink(missing_ok=True)
        shutil.rmtree(lab_folder(path), ignore_errors=True)
    return room, errors


def pc_command(room: Room, name: str, argv: Sequence[str]) -> list[str]:
    """Return ``argv`` wrapped to run in the PC called ``name`` (``pc1``, ``1`` or namespace)."""
    for k, pc in enumerate(room.pcs, start=1):
        if name in (f"pc{k}", str(k), pc.netns, pc.hostname):
            return room.command(pc, argv)
    names = ", ".join(f"pc{k}" for k in range(1, len(room.pcs) + 1))
    raise RoomError(f"no PC {name!r} in the room: choose one of {names}")


def describe_room(room: Room, state_file: Path, *, check: bool = False) -> str:
    """Return the room as a table: each PC's name, IP, and the command prefix to run inside it."""
    lines = [
        f"Emulated room: {len(room.pcs)} PCs on bridge {room.bridge}, subnet {room.subnet}, "
        f"every link shaped to {room.rate}; the instructor's PC (this machine) is "
        f"{room.instructor_ip}.",
        f"  {'PC':5} {'IP':13} {'host name':12} run a command inside it",
    ]
    for k, pc in enumerate(room.pcs, start=1):
        lines.append(
            f"  {'pc' + str(k):5} {pc.ip:13} {pc.hostname:12} ip netns exec {pc.netns} CMD"
        )
    lines.append(
        "`./kit room run pc1 -- CMD` also gives CMD the PC's host name; "
        f"`./kit room down` removes the room (state: {state_file})."
    )
    hosts = lab_folder(state_file) / "hosts.toml"
    if hosts.is_file():
        lines.append(
            f"Rehearse the lab: ./kit lab start {hosts}  (hosts file and SSH stand-ins "
            f"in {hosts.parent}; then ./kit lab status / stop {hosts})"
        )
    if (slurm := lab_folder(state_file) / "slurm.toml").is_file():
        conf = lab_folder(state_file) / "slurm" / "slurm.conf"
        lines.append(
            f"Slurm runs across the PCs (partition {PARTITION!r}): ./kit lab start {slurm}; "
            f"Slurm's own commands with SLURM_CONF={conf} (sinfo, squeue, srun)"
        )
    if check and (gone := [n for n in room.names if n not in leftovers(room.names)]):
        lines.append(f"INCOMPLETE: {', '.join(gone)} no longer exist: run `./kit room down`")
    return "\n".join(lines)


def run_in_room(name: str, argv: Sequence[str], state_file: Path | None = None) -> int:
    """Run ``argv`` in PC ``name`` of the recorded room, in the foreground; return its status."""
    room = read_state(state_file or default_state_file())
    if room is None:
        raise RoomError("no room is up: start one with `./kit room up N`")
    return subprocess.call(pc_command(room, name, argv))
