"""No lecture (the grader). The ranks' byte counts held against the bytes the Linux kernel saw on the wire.

An exercise judged on who talked to whom and how many bytes (A2's halving and doubling, ...)
is judged on the counts its ranks return, and those are counted in the student's processes. The
grader therefore also counts the bytes itself, outside the sandbox, at the sockets
(:mod:`course_grader.sandbox.wire_audit`, recorded by nbval around the probe cell), and asks that
the two agree: every pair of ranks must have carried at least the payload the ranks reported,
and no more than that plus the transport's framing (:mod:`course_grader.verdict.claims`),
so an answer that rewrites its counters, sends what it does not report, or calls a built-in
collective it hides, fails with the pair and both figures named.

The probe cell's kernel code ends with one line naming each rank's process (the engines' PIDs,
ordered by rank): the answer could change that line too, but only to another labelling of the
same processes, since each rank's own traffic must still match what that rank reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from course_grader.verdict.claims import (
    MAX_RANKS,
    PER_MESSAGE_RECEIVED,
    PER_MESSAGE_SENT,
    PER_PAIR,
    Claims,
)
from course_grader.verdict.kernel_data import KernelDataError, marked_json

__all__ = [
    "PIDS_CODE",
    "PIDS_MARK",
    "PID_MAX",
    "UNACCOUNTED_MOST",
    "decode_pids",
    "wire_problem",
]

PIDS_MARK = "COURSE-PIDS:"

#: Kernel code (indented 4, inside the probe function) printing the engines' PIDs by rank.
PIDS_CODE = f"""\
    try:
        import os as _os
        print("{PIDS_MARK}" + json.dumps([int(p) for p in cluster.run(_os.getpid, timeout=20)]))
    except Exception:
        pass
"""

#: Bytes that may cross the loopback outside the sockets open at the end of a probe cell: none
#: did in a right answer's cells on a quiet machine, 12-48 B with both cores busy (TCP options,
#: SACK blocks, that the count cannot tell from payload); the rest went over a connection that
#: closed during the cell, or not over TCP.
UNACCOUNTED_MOST = 4096


#: Linux's largest PID (``/proc/sys/kernel/pid_max`` is at most 2^22).
PID_MAX = 2**22


def decode_pids(stdout: str) -> list[int] | None:
    """The engines' PIDs by rank, from the probe's last ``COURSE-PIDS:`` line (None if absent or not
    a short flat list of distinct PIDs: nothing nested, non-finite or out of range is parsed)."""
    try:
        pids = marked_json(stdout, PIDS_MARK, max_depth=1)
    except KernelDataError:
        return None
    if not isinstance(pids, list) or not 0 < len(pids) <= MAX_RANKS:
        return None
    if not all(type(p) is int and 0 < p <= PID_MAX for p in pids):
        return None
    return pids if len(set(pids)) == len(pids) else None


def _measured(record: Mapping[str, Any], pids: list[int]) -> dict[tuple[int, int], int]:
    """Bytes between ranks on the wire: each socket's owner traced up to the rank that started it."""
    rank_of = {pid: rank for rank, pid in enumerate(pids)}
    out: dict[tuple[int, int], int] = {}
    for sender, receiver, nbytes in record.get("flows", []):
        a = next((rank_of[p] for p in sender if p in rank_of), None)
        b = next((rank_of[p] for p in receiver if p in rank_of), None)
        if a is not None and b is not None and a != b:
            out[(a, b)] = out.get((a, b), 0) + int(nbytes)
    return out


def wire_problem(
    claims: Claims | Sequence[Claims],
    record: Mapping[str, Any] | None,
    stdout: str,
    slack: int = PER_PAIR,
) -> str | None:
    """Why the ranks' reported bytes disagree with the wire (None when they agree).

    ``claims``: one set, or alternatives (:meth:`ClaimsBuilder.alternatives`): the wire must
    agree with one of them, and the first one's disagreement is named. ``slack``: bytes a pair
    may carry beyond the payload reported and its framing (connecting a subgroup costs a few
    hundred bytes per pair, over the rendezvous store at rank 0).
    """
    if record is None:
        return None  # not audited (no sandbox, or not root): the ranks' counts stand alone
    if "error" in record:
        return f"the grader could not count the bytes on the wire: {record['error']}"
    hidden = int(record.get("unaccounted", 0))
    if hidden > max(slack, UNACCOUNTED_MOST):
        return (
            f"{hidden} bytes crossed the sandbox's network outside the connections open at the "
            "end (a connection closed during the probe, or not TCP), so the ranks' counts "
            "cannot be checked: keep to the communicator"
        )
    pids = decode_pids(stdout)
    if pids is None:
        return "the engines' process ids never reached the grader, so the bytes cannot be checked"
    measured = _measured(record, pids)
    options = [claims] if isinstance(claims, Mapping) else list(claims) or [{}]
    first = None
    for option in options:  # the first that agrees ends it; else the first's disagreement
        problem = _disagreement(option, measured, slack)
        if problem is None:
            return None
        first = first or problem
    return first


def _disagreement(
    claims: Claims, measured: Mapping[tuple[int, int], int], slack: int
) -> str | None:
    """The first pair of ranks whose bytes on the wire the claims do not explain (None: all do)."""
    for a, b in sorted(set(claims) | set(measured)):
        said, messages, extra = claims.get((a, b), (0, 0, 0))
        replies = claims.get((b, a), (0, 0, 0))[1]
        seen = measured.get((a, b), 0)
        most = said + PER_MESSAGE_SENT * messages + PER_MESSAGE_RECEIVED * replies + extra + slack
        if not said <= seen <= most:
            return (
                f"rank {a} sent rank {b} {seen} bytes on the wire, but the ranks reported "
                f"{said} bytes{f' in {messages} messages' if messages else ''} (at most {most} "
                "with the transport's framing): the communicator's counts were changed, or "
                "traffic went around them"
            )
    return None
