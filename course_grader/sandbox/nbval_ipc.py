"""No lecture (the grader). pytest plugin for nbval's side of a graded run: Unix-socket kernels and probe outputs.

A sandboxed kernel has a network namespace of its own, so the grader cannot reach it on TCP;
Unix sockets in the run's runtime folder (visible on both sides) connect them instead
(``COURSE_IPC=1``). With ``COURSE_PROBE_DIR`` set, the outputs of the grader's probe cells
(:mod:`course_grader.verdict.probe`) are stored there as JSON, by nbval, outside the sandbox: the
grader reads them from a folder the kernel never sees, not from anything the kernel wrote.
Whatever the kernel sends, nbval holds a bounded amount of it (:func:`cap_message`, the bounds
in :mod:`course_grader.sandbox.output_caps`): a message too large is dropped by ZeroMQ before it
is read (``MAXMSGSIZE``), a few at most wait in nbval's queue, a cell's and a notebook's text
beyond their budgets is cut with a note, and an error's message and traceback are cut too, so
the JUnit report the grader parses stays small.
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
import zmq
from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir

from course_grader.sandbox import wire_audit
from course_grader.sandbox.output_caps import (
    CELL_CHARS,
    ERROR_CHARS,
    MAX_MESSAGE_BYTES,
    MAX_PROBE_CHARS,
    NOTEBOOK_CHARS,
    QUEUED_MESSAGES,
    TRACEBACK_CHARS,
)

__all__ = [
    "MAX_PROBE_CHARS",
    "CappedKernelManager",
    "IpcKernelManager",
    "cap_message",
]

_CUT = "\n[output cut by the grader: more than {} characters]\n"


class CappedKernelManager(KernelManager):
    """A KernelManager whose client's sockets take messages of a bounded size, a few at a time."""

    def _context_default(self) -> zmq.Context:
        self._created_context = True
        context = zmq.Context()
        context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        context.setsockopt(zmq.RCVHWM, QUEUED_MESSAGES)
        return context

    def client(self, **kwargs):
        kwargs.setdefault("context", self.context)  # the client's sockets get the limits too
        return super().client(**kwargs)


class IpcKernelManager(CappedKernelManager):
    """A :class:`CappedKernelManager` whose connection uses the ``ipc`` transport."""

    def __init__(self, **kwargs):
        kwargs.setdefault("transport", "ipc")
        # In the run's runtime folder, which the sandbox shows the kernel (not a temp file).
        name = f"kernel-{uuid.uuid4().hex[:12]}.json"
        kwargs.setdefault("connection_file", os.path.join(jupyter_runtime_dir(), name))
        super().__init__(**kwargs)


nbval.kernel.KernelManager = (
    IpcKernelManager if os.environ.get("COURSE_IPC") == "1" else CappedKernelManager
)

# What the kernel's messages have cost so far; a probe cell (the grader's) spends only its own
# cell's budget, so that an answer's flood cannot silence the probes of later exercises.
_spent = {"notebook": 0, "cell": 0, "cell_id": None, "noted": False, "probe": False}


def cap_message(msg: dict) -> dict:
    """Cut a kernel message's text to what is left of its cell's (the execution it answers) and
    the notebook's budgets, in place: past either, a note once, then nothing; an error's message
    and traceback are cut too."""
    content = msg.get("content") if isinstance(msg, dict) else None
    if not isinstance(content, dict):
        return msg
    cell = (msg.get("parent_header") or {}).get("msg_id")
    if _spent["cell_id"] != cell:
        _spent.update(cell=0, cell_id=cell, noted=False)
    kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
    if kind == "stream" and isinstance(content.get("text"), str):
        content["text"] = _within_budget(content["text"])
    elif kind == "error":
        content["evalue"] = str(content.get("evalue", ""))[:ERROR_CHARS]
        kept, lines = 0, []
        for line in content.get("traceback") or []:
            lines.append(str(line)[: TRACEBACK_CHARS - kept])
            kept += len(lines[-1])
            if kept >= TRACEBACK_CHARS:
                break
        content["traceback"] = lines
    elif kind in ("display_data", "execute_result", "update_display_data"):
        data = content.get("data")
        for key, value in list(data.items()) if isinstance(data, dict) else []:
            data[key] = _within_budget(value if isinstance(value, str) else json.dumps(value))
    return msg


def _within_budget(text: str) -> str:
    """``text`` within what is left of the cell's and the notebook's budgets."""
    notebook_left = CELL_CHARS if _spent["probe"] else NOTEBOOK_CHARS - _spent["notebook"]
    left = max(0, min(CELL_CHARS - _spent["cell"], notebook_left))
    _spent["cell"] += len(text)
    _spent["notebook"] += 0 if _spent["probe"] else len(text)
    if len(text) <= left:
        return text
    note = "" if _spent["noted"] else _CUT.format(min(CELL_CHARS, NOTEBOOK_CHARS))
    _spent["noted"] = True
    return text[:left] + note


_get_kernel_message = nbval.plugin.IPyNbFile.get_kernel_message


def _capped_kernel_message(self, timeout=None, stream="iopub"):
    return cap_message(_get_kernel_message(self, timeout=timeout, stream=stream))


nbval.plugin.IPyNbFile.get_kernel_message = _capped_kernel_message

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
    _spent["probe"] = bool(probe)
    try:
        _runtest(self)
    finally:
        _spent["probe"] = False
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
        # nbval keeps every cell's outputs to the end, and needs none of them (--nbval-lax;
        # the probes' are stored above): at most one cell's are held at a time
        self.test_outputs = []


nbval.plugin.IPyNbCell.runtest = _runtest_keeping_probes
