"""No lecture (the grader). pytest plugin for nbval's side of a graded run: Unix-socket kernels and probe outputs.

A sandboxed kernel has a network namespace of its own, so the grader cannot reach it on TCP;
Unix sockets in the run's runtime folder (visible on both sides) connect them instead
(``COURSE_IPC=1``). With ``COURSE_PROBE_DIR`` set, the outputs of the grader's probe cells
(:mod:`course_grader.verdict.probe`) are stored there as JSON, by nbval, outside the sandbox: the
grader reads them from a folder the kernel never sees, not from anything the kernel wrote.
With ``COURSE_WIRE_AUDIT=1`` as well, each probe's record also holds the bytes the sandbox's
processes sent each other while the cell ran, as the Linux kernel counted them
(:mod:`course_grader.sandbox.wire_audit`), read from outside the sandbox.
Loaded with ``-p course_grader.sandbox.nbval_ipc`` by :func:`course_grader.runner.run_nbval`.
"""

from __future__ import annotations

import json
import os
import uuid

import nbval.kernel
import nbval.plugin
from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir

from course_grader.sandbox import wire_audit

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


def _kernel_netns(cell) -> str:
    """The network namespace of the cell's kernel: that of the sandbox's first process."""
    pid = cell.parent.kernel.km.provisioner.pid
    return f"/proc/{int(pid)}/ns/net"


def _wire_record(before: dict, netns: str, loopback_before: tuple[int, int]) -> dict:
    """The bytes between the sandbox's processes since ``before``, PIDs as the sandbox sees them,
    and the bytes that crossed its loopback outside the sockets open at the end.

    The loopback is read after the sockets at the start and before them at the end, so that
    traffic in between (the engines' heartbeats) is on the sockets' side, never unaccounted.
    """
    wire_audit.settled_sockets(netns)
    loopback_after = wire_audit.loopback(netns)
    after = wire_audit.sockets(netns)
    moved_on_loopback = (
        loopback_after[0] - loopback_before[0],
        loopback_after[1] - loopback_before[1],
    )
    moved = []
    for (sender, receiver), nbytes in sorted(wire_audit.flows(before, after).items()):
        moved.append([wire_audit.ancestry(sender), wire_audit.ancestry(receiver), nbytes])
    return {"flows": moved, "unaccounted": wire_audit.unaccounted(before, after, moved_on_loopback)}


def _runtest_keeping_probes(self) -> None:
    """Run the cell as nbval does; for a probe cell, store its stdout for the grader."""
    folder = os.environ.get("COURSE_PROBE_DIR")
    probe = self.cell.get("metadata", {}).get("course", {}).get("probe") if folder else None
    wire, before, netns, loopback_before = None, None, None, (0, 0)
    if probe and os.environ.get("COURSE_WIRE_AUDIT") == "1":
        try:
            netns = _kernel_netns(self)
            before = wire_audit.sockets(netns)
            loopback_before = wire_audit.loopback(netns)
        except Exception as exc:  # recorded: the grader then fails the exercise, naming it
            wire = {"error": f"the sockets could not be read before the cell: {exc}"[:300]}
    try:
        _runtest(self)
    finally:
        if probe and before is not None:
            try:
                wire = _wire_record(before, netns, loopback_before)
            except Exception as exc:
                wire = {"error": f"the sockets could not be read after the cell: {exc}"[:300]}
        if probe:
            text, size = [], 0
            for out in getattr(self, "test_outputs", None) or []:
                if out.get("output_type") == "stream" and out.get("name") == "stdout":
                    chunk = str(out.get("text", ""))[: MAX_PROBE_CHARS - size]
                    text.append(chunk)
                    size += len(chunk)
            name = os.path.join(folder, f"probe-{self.cell_num}.json")
            with open(name, "w", encoding="utf-8") as handle:
                record = {"exercise": str(probe), "stdout": "".join(text)}
                if wire is not None:
                    record["wire"] = wire
                json.dump(record, handle)


nbval.plugin.IPyNbCell.runtest = _runtest_keeping_probes
