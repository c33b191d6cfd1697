"""pytest plugin: nbval's kernels talk over Unix sockets (``ipc``), not TCP.

A sandboxed kernel has a network namespace of its own, so the grader cannot reach it on TCP;
Unix sockets in the run's runtime folder (visible on both sides) connect them instead.
Loaded with ``-p course_lib.grading.nbval_ipc`` by :func:`course_lib.grading.runner.run_nbval`.
"""

from __future__ import annotations

import os
import uuid

import nbval.kernel
from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir

__all__ = ["IpcKernelManager"]


class IpcKernelManager(KernelManager):
    """A KernelManager whose connection uses the ``ipc`` transport."""

    def __init__(self, **kwargs):
        kwargs.setdefault("transport", "ipc")
        # In the run's runtime folder, which the sandbox shows the kernel (not a temp file).
        name = f"kernel-{uuid.uuid4().hex[:12]}.json"
        kwargs.setdefault("connection_file", os.path.join(jupyter_runtime_dir(), name))
        super().__init__(**kwargs)


nbval.kernel.KernelManager = IpcKernelManager
