"""Lecture 0: The doctor: one table of every engine, with version mismatches and silent engines flagged."""

from __future__ import annotations

import html
import platform
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import ipyparallel as ipp

from course_lib.cluster import engine_side
from course_lib.i18n import _

__all__ = ["COLUMNS", "VERSION_COLUMNS", "DoctorReport", "doctor"]

COLUMNS = (
    "engine",
    "rank",
    "mpi_rank",
    "host",
    "pid",
    "python",
    "torch",
    "mpi4py",
    "gpu",
    "status",
)
# Engines that disagree on these unpickle each other's data wrongly or fail in odd ways.
VERSION_COLUMNS = ("python", "torch", "mpi4py")


@dataclass
class DoctorReport:
    """Rows of engine facts plus the problems found; shows as a table in a notebook."""

    rows: list[dict[str, Any]]
    problems: list[str] = field(default_factory=list)
    flagged: set[tuple[int, str]] = field(default_factory=set)  # (row index, column)

    @property
    def ok(self) -> bool:
        """Return True when every engine answered and all versions agree."""
        return not self.problems

    def __str__(self) -> str:
        cells = [[str(row.get(col, "")) for col in COLUMNS] for row in self.rows]
        for i, j in ((i, COLUMNS.index(col)) for i, col in self.flagged):
            cells[i][j] += " !"
        widths = [max(len(c), *(len(r[j]) for r in cells)) for j, c in enumerate(COLUMNS)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
        lines.append(_("OK: every engine answered, versions agree") if self.ok else _("PROBLEMS:"))
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{col}</th>" for col in COLUMNS)
        body = []
        for i, row in enumerate(self.rows):
            tds = []
            for col in COLUMNS:
                style = ' style="background:#f8d0d0"' if (i, col) in self.flagged else ""
                tds.append(f"<td{style}>{html.escape(str(row.get(col, '')))}</td>")
            body.append(f"<tr>{''.join(tds)}</tr>")
        verdict = (
            "<p>OK: every engine answered, versions agree</p>"
            if self.ok
            else "<ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in self.problems) + "</ul>"
        )
        return f"<table><tr>{head}</tr>{''.join(body)}</table>{verdict}"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))


def _client_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("torch", "mpi4py"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = "missing"
    return versions


def doctor(
    client: ipp.Client,
    timeout: float = 5.0,
    expected: int | None = None,
    describe_timeout: float = 120.0,
) -> DoctorReport:
    """Ask every registered engine to describe itself; flag mismatches and engines that are silent.

    An engine that does not answer a trivial call within ``timeout`` is reported unreachable;
    the others get ``describe_timeout`` to report, since importing torch for the first time
    takes seconds on a loaded machine. The notebook's own versions count as one more voice: an
    engine that differs from the client cannot be sent the client's functions safely.
    """
    ids = sorted(client.ids)
    pings = {eid: client[eid].apply_async(engine_side.engine_pid) for eid in ids}
    deadline = time.monotonic() + timeout
    rows, problems, flagged = [], [], set()
    describing = {}
    for eid in ids:
        try:
            pings[eid].get(timeout=max(0.01, deadline - time.monotonic()))
            describing[eid] = client[eid].apply_async(engine_side.describe_engine)
        except Exception as exc:  # noqa: BLE001 - timed out, died or stale: all "unreachable"
            describing[eid] = exc
    for eid in ids:
        pending = describing[eid]
        try:
            if isinstance(pending, Exception):
                raise pending
            rows.append({"engine": eid, **pending.get(timeout=describe_timeout), "status": "ok"})
        except Exception as exc:  # noqa: BLE001
            rows.append({"engine": eid, "status": "unreachable"})
            flagged.add((len(rows) - 1, "status"))
            problems.append(
                f"engine {eid} did not answer within {timeout:g} s ({type(exc).__name__}): "
                "it is busy or hung; cluster.recover() interrupts or restarts it"
            )
    mpi_ranks = [row.get("mpi_rank") for row in rows]
    for rank, row in enumerate(rows):
        row["rank"] = row.get("mpi_rank") if None not in mpi_ranks else rank
    client_versions = _client_versions()
    for col in VERSION_COLUMNS:
        answered = [(i, row[col]) for i, row in enumerate(rows) if row["status"] == "ok"]
        votes = Counter(value for _, value in answered)
        if len(votes) > 1 or (votes and client_versions[col] not in votes):
            majority = votes.most_common(1)[0][0] if votes else client_versions[col]
            for i, value in answered:
                if value != majority or value != client_versions[col]:
                    flagged.add((i, col))
            problems.append(
                f"{col} versions differ: engines have {dict(votes)}, this notebook has "
                f"{client_versions[col]!r}; install the same version everywhere"
            )
    if expected is not None and len(ids) < expected:
        problems.append(f"only {len(ids)} of {expected} engines are registered")
    return DoctorReport(rows, problems, flagged)
