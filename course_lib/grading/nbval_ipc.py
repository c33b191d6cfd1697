"""No lecture (the grader). pytest plugin for nbval's side of a graded run: Unix-socket kernels and probe outputs.

A sandboxed kernel has a network namespace of its own, so the grader cannot reach it on TCP;
Unix sockets in the run's runtime folder (visible on both sides) connect them instead
(``COURSE_IPC=1``). With ``COURSE_PROBE_DIR`` set, the outputs of the grader's probe cells
(:mod:`course_lib.grading.probes.core`) are stored there as JSON, by nbval, outside the sandbox: the
grader reads them from a folder the kernel never sees, not from anything the kernel wrote.
Loaded with ``-p course_lib.grading.nbval_ipc`` by :func:`course_lib.grading.runner.run_nbval`.
"""

from __future__ import annotations

import json
import os
import uuid

import nbval.kernel
import nbval.plugin
from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir

__all__ = ["MAX_PROBE_CHARS", "IpcKernelManager"]

MAX_PROBE_CHARS = 32 * 2**20  # a probe's answer is a few arrays; more is not an answer


class IpcKernelManager(KernelManager):
    """A KernelManager whose connection uses the ``ipc`` transport."""

    def __init__(self, **kwargs):
        kwargs.setdefault("transport", "ipc")
        # In the run's runtime folder, which the sandbox shows the kernel (not a temp file).
        name = f"kernel-{uuid.uuid4().hex[:12]}.json"
        kwargs.setdefault("connection_file", os.path.join(jupyter_runtime_dir(), name))
        super().__init__(**kwargs)


if os.environ.get("COURSE_IPC") == "1":
    nbval.kernel.KernelManager = IpcKernelManager

_runtest = nbval.plugin.IPyNbCell.runtest


def _runtest_keeping_probes(self) -> None:
    """Run the cell as nbval does; for a probe cell, store its stdout for the grader."""
    folder = os.environ.get("COURSE_PROBE_DIR")
    probe = self.cell.get("metadata", {}).get("course", {}).get("probe") if folder else None
    try:
        _runtest(self)
    finally:
        if probe:
            text, size = [], 0
            for out in getattr(self, "test_outputs", None) or []:
                if out.get("output_type") == "stream" and out.get("name") == "stdout":
                    chunk = str(out.get("text", ""))[: MAX_PROBE_CHARS - size]
                    text.append(chunk)
                    size += len(chunk)
            name = os.path.join(folder, f"probe-{self.cell_num}.json")
            with open(name, "w", encoding="utf-8") as handle:
                json.dump({"exercise": str(probe), "stdout": "".join(text)}, handle)


nbval.plugin.IPyNbCell.runtest = _runtest_keeping_probes
