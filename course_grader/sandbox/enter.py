"""The sandbox's first process: namespaces, a root of read-only binds, limits, then the kernel.

``python -m course_grader.sandbox.enter CONFIG.json -- KERNEL ARGV...`` is the kernel command
the grader gives Jupyter (see :mod:`course_grader.sandbox.config`). It uses only what every Linux
kernel has (``unshare(2)``, ``mount(2)``, ``chroot(2)``, rlimits), so no tool needs installing:

1. new mount, network, PID, UTS and IPC namespaces (and a user namespace when not run as root);
2. a fork: the child is PID 1 of the new PID namespace, so when it ends, every process the
   student started (engines, a fork bomb, a double-forked daemon) is killed by the kernel;
3. a fresh ``tmpfs`` root holding read-only binds of the system, Python, the virtual environment
   and the kit's package, and nothing else: no instructor sources, submissions or gradebook;
   a size-limited ``tmpfs`` at ``/tmp`` (home, working folder and ``$IPYTHONDIR``) and
   ``/dev/shm`` is the only place to write, besides the folder of the kernel's sockets (itself a
   size-limited tmpfs on the host when the grader runs as root); packages an assignment forbids
   (``torch`` in A1) are covered by a package that refuses to import, and the kit's modules that
   hold an assignment's answers by a copy with those functions cut out (:mod:`.kit_cut`);
4. loopback up (engines and gloo talk over it), no other interface: nothing outside is reachable;
5. rlimits (address space, processes, CPU time, file size), then the kernel runs as an
   unprivileged user (a uid of its own when started as root; no capabilities otherwise).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys
from pathlib import Path

__all__ = ["main"]

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SIOCSIFFLAGS, IFF_UP = 0x8914, 0x1
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox: {what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def _bind(source: str, root: str, writable: bool = False) -> None:
    """Bind ``source`` at the same path under ``root``; read-only (and every mount below it)."""
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).touch()
    _mount(source, target, None, MS_BIND | MS_REC)
    if writable:
        return
    below = [target]  # a recursive bind copies the mounts below: make each read-only too
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(target + "/"):
                below.append(point)
    for point in below:
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        try:
            _mount(None, point, None, flags)
        except OSError:  # a locked mount (nodev/noexec set by the host): keep its flags
            _mount(None, point, None, flags | MS_NOEXEC)


def _loopback_up() -> None:
    """Bring ``lo`` up: the new network namespace has only it, and down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", IFF_UP))


def _build_root(config: dict) -> None:
    """Mount the sandbox's file system under ``config['root']`` and chroot into it."""
    root = config["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    disk = f"size={config['disk_mb']}m,mode=1777"
    flags = MS_NOSUID | MS_NODEV
    os.makedirs(root + "/tmp", exist_ok=True)
    _mount("tmpfs", root + "/tmp", "tmpfs", flags, disk)
    os.makedirs(root + "/dev", exist_ok=True)
    _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=755")
    for name in DEVICES:
        Path(root + "/dev/" + name).touch()
        _mount("/dev/" + name, root + "/dev/" + name, None, MS_BIND)
    os.makedirs(root + "/dev/shm")
    _mount("tmpfs", root + "/dev/shm", "tmpfs", flags, disk)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, root + "/dev/" + name)
    for path in config["readonly"]:
        if os.path.islink(path):  # /bin -> usr/bin, a venv reached through a link
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            if not os.path.lexists(root + path):
                os.symlink(os.readlink(path), root + path)
        elif os.path.exists(path):
            _bind(path, root)
    for path in config["writable"]:
        _bind(path, root, writable=True)
    for original, copy in config.get("overlays", []):  # kit modules with the answers cut out
        if os.path.isfile(root + original):
            _mount(copy, root + original, None, MS_BIND)
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
            try:
                _mount(None, root + original, None, flags)
            except OSError:  # a locked mount (noexec set by the host): keep its flags
                _mount(None, root + original, None, flags | MS_NOEXEC)
    for path in config.get("blocked", []):  # forbidden packages: an import names why it fails
        _block_package(root + path, config.get("blocked_reason", "not available here"))
    for path in config["hidden"]:  # instructor files that lie below a read-only bind
        below = [p for p in config["readonly"] if (path + "/").startswith(p.rstrip("/") + "/")]
        if not below or any(w.startswith(path.rstrip("/") + "/") for w in config["writable"]):
            continue  # not bound at all, or the run's own folder
        if os.path.isdir(root + path):
            _mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
        elif os.path.exists(root + path):
            _mount("/dev/null", root + path, None, MS_BIND)
    os.makedirs(root + "/proc", exist_ok=True)
    try:
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:  # a container that masks parts of /proc forbids a fresh one
        _bind("/proc", root)
    uid = config["uid"]
    for folder in ("/tmp/home", "/tmp/work", "/tmp/ipython"):
        os.makedirs(root + folder)
        if uid is not None:
            os.chown(root + folder, uid, uid)
    os.chroot(root)
    os.chdir("/tmp/work")


def _block_package(target: str, reason: str) -> None:
    """Cover the package folder ``target`` with a read-only one whose import raises ``reason``."""
    if not os.path.isdir(target):
        return
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "size=16k,mode=755")
    name = os.path.basename(target)
    Path(target, "__init__.py").write_text(
        f"raise ImportError({f'{name} is not available in this sandbox: {reason}'!r})\n"
    )
    _mount(None, target, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _limit(config: dict) -> None:
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (config["processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (config["cpu_seconds"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["disk_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_privileges(uid: int | None) -> None:
    """Become ``uid`` (as root), or give up every capability (in a user namespace)."""
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # a non-root uid: every capability is gone
        return
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = ctypes.create_string_buffer(24)  # effective, permitted, inheritable: all empty
    _check(_libc.capset(ctypes.c_char_p(header), data), "capset")


def _as_init(config: dict, argv: list[str]) -> int:
    """PID 1 of the sandbox: set it up, start the kernel, reap orphans until the kernel ends."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _loopback_up()
    socket.sethostname("localhost")  # gloo and engines resolve it to loopback
    _build_root(config)
    _limit(config)
    _drop_privileges(config["uid"])
    # Changing the uid cleared the parent-death signal (prctl(2)): set it again, so that this
    # PID 1, and with it the whole namespace, dies with the launcher (and so with nbval).
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # $IPYTHONDIR (profiles, cluster files) lives in the size-limited /tmp and dies with it:
    # the grader never reads it. PYTHONPATH names the kit the sandbox shows, so a venv whose
    # editable install points to another checkout (not shown here) still imports this kit.
    os.environ.update(HOME="/tmp/home", TMPDIR="/tmp", PWD="/tmp/work", IPYTHONDIR="/tmp/ipython")
    if config.get("pythonpath"):
        os.environ["PYTHONPATH"] = config["pythonpath"]
    else:
        os.environ.pop("PYTHONPATH", None)
    # The kernel would watch for the grader's pid, which is not in its PID namespace.
    os.environ.pop("JPY_PARENT_PID", None)
    kernel = os.fork()
    if kernel == 0:
        os.execv(argv[0], argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: os.kill(kernel, number))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == kernel:
            return os.waitstatus_to_exitcode(status) & 0xFF


def _enter_namespaces(config: dict) -> None:
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC
    if os.geteuid() != 0:  # an ordinary user: a user namespace where it is root
        uid, gid = os.geteuid(), os.getegid()
        _check(_libc.unshare(CLONE_NEWUSER), "unshare(user)")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
        config["uid"] = None
    _check(_libc.unshare(flags), "unshare(mount, net, pid, uts, ipc)")


def main(argv: list[str] | None = None) -> int:
    """Run ``KERNEL ARGV`` in a sandbox described by ``CONFIG.json``; return its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m course_grader.sandbox.enter CONFIG.json -- COMMAND...")
        return 2
    # The sandbox dies with nbval, which started it (and nbval with the grader: runner.py): the
    # parent-death signal here, and PID 1's own below, end the PID namespace and all in it.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    config = json.loads(Path(argv[0]).read_text())
    command = argv[2:]
    uid = config["uid"]
    if uid is not None and os.geteuid() == 0:
        for path in config["writable"]:  # the run's own folders: the kernel writes sockets there
            for folder, _dirs, files in os.walk(path):
                os.chown(folder, uid, uid)
                for name in files:
                    os.chown(os.path.join(folder, name), uid, uid)
    for procs in config.get("cgroups", []):  # the grader's control group: this sandbox's share
        try:
            Path(procs).write_text(str(os.getpid()))
        except OSError as exc:
            print(f"sandbox: could not join {procs} ({exc}): no CPU share", file=sys.stderr)
    _enter_namespaces(config)
    child = os.fork()
    if child == 0:
        try:
            code = _as_init(config, command)
        except BaseException as exc:  # noqa: BLE001 - say why, then end the namespace
            print(f"sandbox: {exc}", file=sys.stderr, flush=True)
            code = 125
        os._exit(code)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: os.kill(child, number))
    while True:
        try:
            _pid, status = os.waitpid(child, 0)
            return os.waitstatus_to_exitcode(status) & 0xFF
        except InterruptedError:
            continue


if __name__ == "__main__":
    raise SystemExit(main())
