"""No lecture (the grader). How much of a kernel's output the grader holds: cut inside the sandbox, bounded outside.

Inside, the sandboxed kernel starts with :data:`KERNEL_CODE` (its kernelspec's command): every
message it sends has each text cut to :data:`STRING_CHARS` (a probe's line fits) and an error's
message and traceback to :data:`ERROR_CHARS` and :data:`TRACEBACK_CHARS`, with a note, so an
honest flood reads as cut output and the notebook goes on. That code runs in the student's
process, which could undo it; the bound that holds whatever the kernel does is outside, in
nbval (:mod:`course_grader.sandbox.nbval_ipc`): ZeroMQ drops a message over
:data:`MAX_MESSAGE_BYTES` before nbval reads it, at most :data:`QUEUED_MESSAGES` wait, and a
cell's and a notebook's text beyond :data:`CELL_CHARS` and :data:`NOTEBOOK_CHARS` is cut.
"""

from __future__ import annotations

__all__ = [
    "CELL_CHARS",
    "ERROR_CHARS",
    "KERNEL_CODE",
    "MAX_MESSAGE_BYTES",
    "MAX_PROBE_CHARS",
    "NOTEBOOK_CHARS",
    "QUEUED_MESSAGES",
    "STRING_CHARS",
    "TRACEBACK_CHARS",
]

MAX_PROBE_CHARS = 32 * 2**20  # a probe's answer is a few arrays; more is not an answer
#: The longest text one kernel message may carry (the probe's line and a little).
STRING_CHARS = MAX_PROBE_CHARS + 2**16
#: What is kept of an error's message, and of its traceback.
ERROR_CHARS, TRACEBACK_CHARS = 4096, 65536
#: The most text nbval keeps of one cell's outputs, and of the whole notebook's.
CELL_CHARS, NOTEBOOK_CHARS = STRING_CHARS + 2**20, 2 * STRING_CHARS
#: The largest message nbval reads (a string of STRING_CHARS and its envelope), and how many may
#: wait unread: beyond either, ZeroMQ drops them before nbval allocates anything.
MAX_MESSAGE_BYTES, QUEUED_MESSAGES = STRING_CHARS + 2**20, 4

#: The sandboxed kernel's command (``python -c KERNEL_CODE -f CONNECTION_FILE``): ipykernel, with
#: every message's texts cut before they are sent.
KERNEL_CODE = f"""\
from jupyter_client import session as _session

_serialize = _session.Session.serialize
_NOTE = "\\n[output cut in the sandbox: more than {{}} characters]\\n"


def _cut(value, most):
    if isinstance(value, str) and len(value) > most:
        return value[:most] + _NOTE.format(most)
    if isinstance(value, dict):
        return {{k: _cut(v, most) for k, v in value.items()}}
    if isinstance(value, list):
        kept, out = 0, []
        for item in value:
            item = _cut(item, max(most - kept, 0))
            kept += len(item) if isinstance(item, str) else 0
            out.append(item)
            if kept >= most:
                break
        return out
    return value


def _capped(self, msg, ident=None):
    content = msg.get("content") if isinstance(msg, dict) else None
    if isinstance(content, dict):
        content = {{k: _cut(v, {STRING_CHARS}) for k, v in content.items()}}
        if isinstance(content.get("evalue"), str):
            content["evalue"] = _cut(content["evalue"], {ERROR_CHARS})
        if "traceback" in content:
            content["traceback"] = _cut(content["traceback"], {TRACEBACK_CHARS})
        msg = dict(msg, content=content)
    return _serialize(self, msg, ident)


_session.Session.serialize = _capped
from ipykernel import kernelapp as _app

_app.launch_new_instance()
"""
