"""Lecture 0: Functions that run *on* the engines: describe an engine, and set it up for teaching.

They import what they need inside their bodies, because ipyparallel ships a function's code to
the engine and runs it there, where the notebook's imports do not exist.
"""

from __future__ import annotations

from typing import Any

__all__ = ["describe_engine", "setup_engine", "engine_pid"]


def engine_pid() -> int:
    """Return the engine's process id (the cheapest round trip that proves an engine is alive)."""
    import os

    return os.getpid()


def describe_engine(full: bool = True) -> dict[str, Any]:
    """Return this engine's host, pid, MPI rank and (if ``full``) the versions and GPU.

    ``full=False`` skips importing torch (seconds of CPU per engine), for start-up.
    """
    import os
    import platform
    import socket
    import sys
    from importlib import metadata

    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "mpi_rank": None,
        "mpi_size": None,
    }
    # Only ask MPI for a rank when the engine was started as an MPI rank (ipengine --mpi imports
    # mpi4py.MPI); importing it here would initialise a singleton MPI world of size 1.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        info["mpi_rank"] = mpi.COMM_WORLD.Get_rank()
        info["mpi_size"] = mpi.COMM_WORLD.Get_size()
    if not full:
        return info
    for package in ("torch", "mpi4py", "course-lib"):
        try:
            info[package.replace("-", "_")] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package.replace("-", "_")] = "missing"
    try:
        import torch

        info["torch"] = torch.__version__  # what is imported, which may differ from metadata
        info["torch_threads"] = torch.get_num_threads()
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    except ImportError:
        info["torch_threads"], info["gpu"] = None, ""
    return info


def setup_engine(
    rank: int,
    world_size: int,
    kind: str,
    torch_threads: int | None,
    seed: int | None,
    seed_per_rank: bool,
) -> dict[str, Any]:
    """Define ``rank`` / ``world_size`` on the engine, limit torch threads and seed the RNGs."""
    import random
    import sys

    import numpy as np
    from IPython import get_ipython

    # The engine's user namespace is what `%px print(rank)` and applied functions see.
    get_ipython().user_ns.update(rank=rank, world_size=world_size, cluster_kind=kind)

    # N engines on C cores: each engine gets C // N threads, or they thrash. Engines we start
    # also get OMP_NUM_THREADS, which torch reads when it is first imported; importing torch
    # here just to set it would add seconds to every start.
    torch = sys.modules.get("torch")
    if seed is not None and torch is None:
        import torch
    if torch is not None and torch_threads:
        torch.set_num_threads(torch_threads)
    if seed is not None:
        engine_seed = seed + rank if seed_per_rank else seed
        random.seed(engine_seed)
        np.random.seed(engine_seed)
        if torch is not None:
            torch.manual_seed(engine_seed)
    return {"rank": rank, "world_size": world_size}
