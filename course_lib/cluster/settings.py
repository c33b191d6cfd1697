"""Lecture 0: what a notebook asks of its cluster: the kinds, the validated settings, the error.

:class:`ClusterSettings` checks a request once, with advice in the error, and fills unset fields
from the ``COURSE_CLUSTER_*`` variables that the lab's ``./kit lab start`` sets; the launcher
(:mod:`course_lib.cluster.launch`) and the cluster it returns
(:mod:`course_lib.cluster.course_cluster`) both read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KINDS",
    "ClusterError",
    "ClusterSettings",
    "default_engine_count",
    "threads_per_engine",
]

KINDS = ("local", "mpi", "connect")


class ClusterError(RuntimeError):
    """A cluster could not be started or reached; the message says what to do."""


def default_engine_count() -> int:
    """Return a sensible engine count for this machine: its cores, at least 2, at most 4."""
    return max(2, min(os.cpu_count() or 2, 4))


@dataclass(frozen=True)
class ClusterSettings:
    """Validated settings for :func:`start_cluster`; unset fields come from the environment."""

    kind: str = "local"
    n: int | None = None
    profile: str | None = None
    connection_file: str | None = None
    torch_threads: int | None = None
    seed: int | None = None
    seed_per_rank: bool = False
    timeout: float = 60.0
    #: connected engines that must be MPI ranks: the room's MPI world (asked as kind="mpi")
    mpi: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown cluster kind {self.kind!r}: choose one of {', '.join(KINDS)}"
            )
        if self.n is not None and (not isinstance(self.n, int) or self.n < 1):
            raise ValueError(f"n={self.n!r}: the number of engines must be an integer >= 1")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads={self.torch_threads}: use an integer >= 1, or None")
        if self.timeout <= 0:
            raise ValueError(f"timeout={self.timeout}: use a positive number of seconds")
        if self.kind == "connect" and not (self.profile or self.connection_file):
            raise ValueError(
                "kind='connect' needs profile='NAME' or connection_file='.../ipcontroller-client.json'"
            )

    @classmethod
    def from_environment(cls, **overrides: Any) -> ClusterSettings:
        """Build settings from arguments, falling back to ``COURSE_CLUSTER_*`` variables."""
        env = os.environ
        given = {key: value for key, value in overrides.items() if value is not None}
        profile = given.get("profile", env.get("COURSE_CLUSTER_PROFILE") or None)
        connection_file = given.get("connection_file", env.get("COURSE_CLUSTER_FILE") or None)
        kind = given.get("kind", env.get("COURSE_CLUSTER_KIND") or None)
        if kind is None:
            kind = "connect" if (profile or connection_file) else "local"
        elif kind == "mpi" and (profile or connection_file):
            # A notebook that needs MPI ranks, in the lab: the room's MPI world (one seat).
            kind, given["mpi"] = "connect", True
        if "n" not in given and env.get("COURSE_CLUSTER_ENGINES"):
            try:
                given["n"] = int(env["COURSE_CLUSTER_ENGINES"])
            except ValueError:
                raise ValueError(
                    f"COURSE_CLUSTER_ENGINES={env['COURSE_CLUSTER_ENGINES']!r} is not an integer"
                ) from None
        given.update(kind=kind, profile=profile, connection_file=connection_file)
        return cls(**given)


def threads_per_engine(settings: ClusterSettings, n: int) -> int | None:
    """Return threads for each of ``n`` engines: as asked, else cores // n; a lab cluster keeps its own."""
    if settings.torch_threads is not None or settings.kind == "connect":
        return settings.torch_threads
    return max(1, (os.cpu_count() or 1) // max(1, n))
