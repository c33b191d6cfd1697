"""Lecture 0: When engines die under a notebook: one line saying which, why if known, and the next step that works here.

An engine that dies mid-cell (killed, its PC switched off, the Slurm job that ran it cancelled)
reaches the notebook as ipyparallel's ``EngineError``, or a ``CompositeError`` with one
``EngineError`` per engine, a screen of lines a student cannot act on. :func:`death_message`
turns such an error into one line: the ranks and engines that died, what ran them (a seat of the
instructor's room, a Slurm job named by its id, engines this notebook started), and the one next
step that works in that setting. ``start_cluster`` installs :func:`show_deaths_in_one_line` in a
notebook's kernel, so a raw ``view.apply_sync`` or ``%px`` that meets a dead engine prints that
line instead of the traceback; every other error keeps its usual traceback. Engines that end
while they start are said the same way: how their process ended (:func:`how_engine_sets_ended`,
``mpiexec ended on signal SIGFPE``) rather than a wait that would not have helped.
"""

from __future__ import annotations

import re
import signal
import sys
import weakref
from typing import Any

from course_lib.i18n import _

__all__ = [
    "dead_engine_ids",
    "death_message",
    "engine_sets_output",
    "how_engine_sets_ended",
    "next_step_after_a_death",
    "show_deaths_in_one_line",
]

_DIED = re.compile(r"Engine (\d+) died")


def dead_engine_ids(exc: BaseException) -> list[int] | None:
    """Return the engines an error says died, or None when it is not (only) about dead engines."""
    import ipyparallel as ipp

    if isinstance(exc, ipp.error.CompositeError):
        entries = [(ename, str(evalue)) for ename, evalue, *_ in exc.elist]
    elif isinstance(exc, ipp.error.EngineError):
        entries = [("EngineError", str(exc))]
    else:
        return None
    if not entries or any(ename != "EngineError" for ename, _ in entries):
        return None
    # ipyparallel says "Engine 3 died while running task '...'" and gives no engine id apart.
    return sorted({int(m[1]) for _, text in entries if (m := _DIED.search(text))})


def next_step_after_a_death(cluster: Any) -> str:
    """Return the next step that works after an engine died, where this cluster lives."""
    seat = getattr(cluster, "seat", None)
    if getattr(cluster, "owned", None) is not None:  # this notebook started the engines
        return _("cluster.recover() restarts the engines; then re-run")
    if seat is not None and getattr(seat, "job", None):
        return _(
            "the Slurm job {job} that ran the room's engines has ended or lost a node: "
            "tell the instructor (./kit lab status says why), then run start_cluster again"
        ).format(job=seat.job)
    if seat is not None:
        return _(
            "the room's engine is gone: tell the instructor (./kit lab status names the PC, "
            "./kit lab add repairs it), then run start_cluster again for a fresh seat"
        )
    return _("ask whoever started the cluster to restart its engines, then connect again")


def death_message(cluster: Any, exc: BaseException) -> str | None:
    """Return one line for an error about dead engines of ``cluster``, or None for any other error."""
    ids = dead_engine_ids(exc)
    if ids is None:
        return None
    ranks = getattr(cluster, "ids_by_rank", []) if cluster is not None else []
    named = [
        _("rank {rank} (engine {engine})").format(rank=ranks.index(e), engine=e)
        if e in ranks
        else _("engine {engine}").format(engine=e)
        for e in ids
    ]
    who = ", ".join(named) or _("engines")
    return _("course_lib: {who} died while running this cell; {next_step}").format(
        who=who, next_step=next_step_after_a_death(cluster)
    )


def show_deaths_in_one_line(cluster: Any) -> bool:
    """In an IPython kernel, print :func:`death_message` instead of the traceback for dead engines.

    Returns False outside IPython. The kernel keeps one such handler: the latest cluster's
    (held weakly, so a dropped cluster is not kept alive by it).
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    import ipyparallel as ipp

    latest = weakref.ref(cluster)

    def handler(
        shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None
    ) -> None:
        message = death_message(latest(), value)
        if message is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return
        print(message, file=sys.stderr)

    shell.set_custom_exc((ipp.error.CompositeError, ipp.error.EngineError), handler)
    return True


def engine_sets_output(owned: Any) -> str:
    """Return the last of what an ipyparallel cluster's engine sets printed, for an error message."""
    texts = []
    for engine_set in list(owned.engines.values()):
        try:
            texts.append(engine_set.get_output() or "")
        except Exception:  # noqa: BLE001 - best effort, we are already reporting an error
            pass
    text = "\n".join(t for t in texts if t).strip()
    return f"\nEngine output:\n{text[-2000:]}" if text else ""


def how_engine_sets_ended(owned: Any, kind: str) -> str | None:
    """Return how an engine set's process ended ("mpiexec ended on signal SIGFPE"), or None."""
    process = "mpiexec" if kind == "mpi" else "an engine"
    for engine_set in list(owned.engines.values()):
        code = (getattr(engine_set, "stop_data", None) or {}).get("exit_code")
        if isinstance(code, int) and code < 0 and -code in signal.valid_signals():
            return f"{process} ended on signal {signal.Signals(-code).name}"
        if isinstance(code, int) and code > 0:
            return f"{process} ended with exit code {code}"
    return None
