"""No lecture (the grader). A sandbox per graded notebook: what the kernel sees, where it may write, what it may use.

nbval (the grader's side) runs outside; only the kernel it starts, and everything that kernel
starts (ipyparallel controller and engines, gloo workers, whatever an answer spawns), runs
inside. The kernel is started through a kernelspec of the run's own whose command is
:mod:`course_grader.sandbox.enter`; kernel and nbval talk over Unix sockets in the run's
folder (``ipc`` transport, :mod:`course_grader.sandbox.nbval_ipc`), since the kernel has no network
but its own loopback.

Inside, the kernel sees read-only: the system (``/usr``, ``/etc``, ...), Python, the virtual
environment and, where the assignment's checks still run in the kernel, the kit's package
``course_lib``. It does not see the instructor sources, other submissions, the gradebook, the
checkout's other folders or any home folder, nor the packages its assignment forbids. It writes
to a size-limited ``/tmp`` (its home, working folder and ``$IPYTHONDIR``) that is thrown away
with the run; the grader never reads anything the kernel wrote there.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from course_grader.sandbox.kit_cut import cut_overlays
from course_grader.sandbox.output_caps import KERNEL_CODE

__all__ = [
    "SandboxLimits",
    "foreign_site_packages",
    "host_tmpfs",
    "kernel_name",
    "grader_package",
    "kit_package",
    "package_folders",
    "prepare_sandbox",
    "sandbox_problem",
]

KERNEL_NAME = "course-sandbox"
_INIT = Path(__file__).with_name("enter.py")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-notebook limits inside the sandbox (each process: memory, CPU; the run: the rest)."""

    memory_mb: int = 8192  # address space of each process (torch alone reserves ~3.5 GB)
    processes: int = 1024  # tasks (processes and threads) the notebook may have at once
    cpu_seconds: int = 900  # CPU time of each process
    disk_mb: int = 1024  # size of /tmp (and of /dev/shm) inside the sandbox
    hidden: tuple[str, ...] = field(default=())  # extra paths never to show the kernel
    # The whole sandbox, in a control group of its own where one can be made (cgroup.py): its
    # memory (every process together), and the cores it may use at most (0: all of them);
    # every sandbox has the same CPU weight, whatever number of processes it starts.
    total_memory_mb: int = 12288
    cpus: float = 0.0
    share: bool = True  # False: no control group (bench/bench_grading_sandbox.py times both)

    def __post_init__(self) -> None:
        for name, least in (
            ("memory_mb", 4096),
            ("processes", 64),
            ("cpu_seconds", 10),
            ("disk_mb", 16),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < least:
                option = "--" + name.replace("_mb", "").replace("_", "-")
                raise ValueError(
                    f"sandbox {name}={value!r}: use a whole number of at least {least} "
                    f"(option {option}); the kit's own notebooks need that much"
                )


def kit_package() -> Path:
    """The folder of the kit's package ``course_lib`` that this process imports."""
    import course_lib

    return Path(course_lib.__file__).resolve().parent


def grader_package() -> Path:
    """The folder of the grader's package ``course_grader`` that this process imports."""
    import course_grader

    return Path(course_grader.__file__).resolve().parent


def _readonly_paths(kit: bool = True) -> list[str]:
    """The system, Python, the venv and (``kit``) the kit's package: what a kernel needs."""
    paths = list(_SYSTEM)
    for prefix in (sys.base_prefix, sys.prefix, sys.exec_prefix):
        for variant in (Path(prefix), Path(prefix).resolve()):
            if str(variant) not in paths:
                paths.append(str(variant))
    if kit:  # the grader's folder too: a probe may show one helper of it (the rest is hidden)
        paths += [str(kit_package()), str(grader_package())]
    return [p for p in paths if os.path.lexists(p)]


def foreign_site_packages() -> list[str]:
    """Every other interpreter's package folder on a path the sandbox binds: the base Python's
    ``site-packages`` (which the venv does not use), the system's ``dist-packages``.

    The sandbox hides them all, so that only the venv's packages import there: a package an
    assignment forbids is covered in the venv (``blocked``), and no other copy is left to find
    (issue 35: scipy, forbidden in A1, imported from the base interpreter's site-packages).
    """
    import site

    own = {str(Path(p).resolve()) for p in site.getsitepackages([sys.prefix])}
    found = []
    for prefix in {sys.base_prefix, sys.base_exec_prefix, "/usr", "/usr/local"}:
        for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages",
                        "lib/python3/dist-packages", "lib64/python3*/site-packages"):  # fmt: skip
            for folder in sorted(Path(prefix).glob(pattern)):
                real = str(folder.resolve())
                if real not in own and real not in found and folder.is_dir():
                    found.append(real)
    return found


def package_folders(names: tuple[str, ...]) -> list[str]:
    """Return the real folders of the installed top-level packages ``names`` (none imported)."""
    found = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name.split(".")[0])
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            real = str(Path(location).resolve())  # the sandbox binds the venv at its real path
            if real not in found:
                found.append(real)
    return found


@contextlib.contextmanager
def host_tmpfs(folder: Path, size_mb: int) -> Iterator[bool]:
    """Mount a ``size_mb`` tmpfs on ``folder`` for the block (as root); yield whether it did.

    The kernel's socket folder is the one place the sandbox shares with the host: as a tmpfs
    of its own, what the kernel writes there cannot fill the host's disk.
    """
    folder.mkdir(parents=True, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    mounted = (
        os.geteuid() == 0
        and sys.platform.startswith("linux")
        and libc.mount(
            b"tmpfs",
            str(folder).encode(),
            b"tmpfs",
            2 | 4 | 8,
            f"size={size_mb}m,mode=755".encode(),
        )
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            libc.umount2(str(folder).encode(), 2)  # MNT_DETACH: even while a socket is open


def kernel_name() -> str:
    """The kernelspec name nbval is told to use for a sandboxed run."""
    return KERNEL_NAME


def prepare_sandbox(
    run_dir: Path,
    limits: SandboxLimits,
    hidden: tuple[str, ...] = (),
    blocked: tuple[str, ...] = (),
    kit: bool = True,
    cgroups: tuple[str, ...] = (),
    cut: tuple[str, ...] = (),
) -> dict[str, str]:
    """Write the run's kernelspec and sandbox settings; return the environment nbval needs.

    ``run_dir`` holds the sandbox's settings (never shown to the kernel), the kernelspec and
    the kernel's connection file and sockets (``run_dir/runtime``, the only folder shared).
    ``blocked``: packages that must not import inside (an assignment's forbidden imports);
    ``kit``: whether the kernel sees ``course_lib`` (not when its checks run in the grader);
    ``cgroups``: the ``cgroup.procs`` files the sandbox's launcher joins (:mod:`.cgroup`);
    ``cut``: the kit's functions the kernel sees only as stubs (:mod:`.kit_cut`; with ``kit``).
    """
    runtime = run_dir / "runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    # run_dir is never shown to the kernel: only its cut copies, each bound over its module
    cutting = kit and cut
    overlays, caches = (
        cut_overlays(cut, run_dir / "kit_cut", kit_package().parent) if cutting else ([], [])
    )
    config = {
        "root": str(run_dir / "root"),
        "readonly": _readonly_paths(kit),
        "writable": [str(runtime)],
        "hidden": [
            *(str(Path(p).resolve()) for p in (*hidden, *limits.hidden)),
            *foreign_site_packages(),
            *caches,
        ],
        "overlays": overlays,
        "blocked": package_folders(blocked),
        "blocked_reason": "this assignment forbids it; the grader runs its checks itself",
        "pythonpath": str(kit_package().parent) if kit else "",
        # As root the kernel runs as a uid of its own: it owns no file outside the sandbox, and
        # its process count (RLIMIT_NPROC counts per uid) is its alone.
        "uid": random.randrange(2_000_000, 3_000_000) if os.geteuid() == 0 else None,
        "memory_mb": limits.memory_mb,
        "processes": limits.processes,
        "cpu_seconds": limits.cpu_seconds,
        "disk_mb": limits.disk_mb,
        "cgroups": list(cgroups),
    }
    settings = run_dir / "sandbox.json"
    settings.write_text(json.dumps(config))
    spec_dir = run_dir / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-I",
        "-S",
        str(_INIT),
        str(settings),
        "--",
        sys.executable,
        "-c",
        KERNEL_CODE,  # ipykernel, its messages' texts cut in the sandbox (output_caps)
        "-f",
        "{connection_file}",
    ]
    spec = {
        "argv": argv,
        "display_name": "Python 3 (sandbox)",
        "language": "python",
        "interrupt_mode": "message",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return {"JUPYTER_PATH": str(run_dir / "jupyter"), "JUPYTER_RUNTIME_DIR": str(runtime)}


@functools.lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """Return why no sandbox can be made on this machine, or None when one can."""
    if not sys.platform.startswith("linux"):
        return f"no sandbox on {sys.platform}: it needs Linux namespaces"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as tmp:
        env = prepare_sandbox(Path(tmp), SandboxLimits())
        spec = json.loads(
            Path(env["JUPYTER_PATH"], "kernels", KERNEL_NAME, "kernel.json").read_text()
        )
        argv = spec["argv"][: spec["argv"].index("--") + 1]
        probe = "import socket; socket.create_connection(('127.0.0.1', 9), 1)"
        try:
            done = subprocess.run(
                [
                    *argv,
                    sys.executable,
                    "-c",
                    f"try:\n {probe}\nexcept ConnectionRefusedError: pass",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the sandbox could not start: {exc}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"the sandbox could not start ({why}); namespaces may be disabled here"
    return None
