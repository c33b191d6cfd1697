"""The instructor's lab (docs/instructor.md; lecture 0 connects to it): The lab's hosts file: which PCs run how many engines, with which Python, reached how.

A small TOML file the instructor writes once per room::

    [controller]
    ip = "192.168.10.1"        # the instructor's address on the lab network ("*": every one)
    profile = "lab"
    seat = 2                   # engines per student's notebook (omit: as many as it asks for)

    [defaults]
    python = "/opt/course/.venv/bin/python"   # the same venv path on every PC
    engines = 1

    [[pc]]
    host = "lab-pc-01"         # what `ssh` reaches: a name or an address, user@host allowed
    engines = 2

    [[pc]]
    host = "192.168.10.22"
    python = 'C:\\course\\.venv\\Scripts\\python.exe'   # a Windows PC with OpenSSH server

``[mpi] ranks = N`` also starts N engines that are MPI ranks of one world, placed on the PCs as
``./kit lab mpi`` places ranks (a notebook's ``start_cluster("mpi", N)`` gets them as one seat;
every PC needs the same venv path and the instructor's profile folder at the same path).

``[ssh] command`` / ``scp`` replace the ``ssh`` / ``scp`` programs (another port, a key, or a
stand-in that reaches the emulated room's PCs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LabHosts", "LabPC", "read_hosts"]


@dataclass(frozen=True)
class LabPC:
    """One PC of the lab: the ssh location, its engines and its Python."""

    host: str
    engines: int
    python: str

    def __post_init__(self) -> None:
        if not self.host or any(c.isspace() for c in self.host):
            raise ValueError(f"host {self.host!r}: give the PC's name or address, no spaces")
        if not 0 <= self.engines <= 256:
            raise ValueError(f"{self.host}: engines={self.engines}; use 0..256 (0: none there)")
        if not self.python:
            raise ValueError(f"{self.host}: no python: set python = '/path/to/.venv/bin/python'")


@dataclass(frozen=True)
class LabHosts:
    """The whole hosts file: the controller's address and profile, the PCs, ssh and scp."""

    pcs: tuple[LabPC, ...]
    controller_ip: str = "*"
    profile: str = "lab"
    ssh: tuple[str, ...] = ("ssh",)
    scp: tuple[str, ...] = ("scp",)
    mpi_ranks: int = 0  # engines that are MPI ranks of one world, besides the PCs' engines
    seat: int | None = None  # engines per notebook's seat; None: what the notebook asks for
    path: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.pcs or sum(pc.engines for pc in self.pcs) == 0:
            raise ValueError("no engines: add [[pc]] tables with host = '...' and engines = N")
        hosts = [pc.host for pc in self.pcs]
        if len(set(hosts)) != len(hosts):
            twice = sorted({h for h in hosts if hosts.count(h) > 1})
            raise ValueError(f"PCs listed twice: {', '.join(twice)}; list each PC once")
        if not 0 <= self.mpi_ranks <= self.engines:
            raise ValueError(
                f"[mpi] ranks = {self.mpi_ranks}; use 0..{self.engines} (the ranks go where the "
                "engines are, at most one per engine slot)"
            )
        if self.seat is not None and not 1 <= self.seat <= self.engines:
            raise ValueError(
                f"[controller] seat = {self.seat}; use 1..{self.engines} engines per student's "
                "notebook (e.g. 2 seats a room of 8 engines four at a time)"
            )
        if self.mpi_ranks and len({pc.python for pc in self.pcs if pc.engines}) > 1:
            raise ValueError(
                "[mpi] ranks needs the same python path on every PC with engines "
                "(mpiexec starts every rank with one command)"
            )

    @property
    def engines(self) -> int:
        """Return the number of engines on all PCs together."""
        return sum(pc.engines for pc in self.pcs)


_KNOWN = {"controller": {"ip", "profile", "seat"}, "defaults": {"python", "engines"},
          "ssh": {"command", "scp"}, "pc": {"host", "engines", "python"},
          "mpi": {"ranks"}}  # fmt: skip


def _check_keys(table: dict, name: str, where: str) -> None:
    unknown = sorted(set(table) - _KNOWN[name])
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(unknown)} in [{name}]; "
            f"known: {', '.join(sorted(_KNOWN[name]))}"
        )


def _toml() -> Any:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # the same parser, from PyPI, for Python 3.10
        except ModuleNotFoundError:
            raise ValueError(
                "reading a hosts file needs Python 3.11+ or: pip install tomli"
            ) from None
    return tomllib


def _seat_size(value: Any, path: Path) -> int | None:
    """Return ``[controller] seat`` as a number of engines (None when not given)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{path}: [controller] seat = {value!r}; give a whole number, e.g. seat = 2"
        )
    return value


def read_hosts(path: str | Path) -> LabHosts:
    """Read and check a hosts file; a mistake raises ValueError that names the fix."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"{path} does not exist: write the lab's hosts file (docs/instructor.md, section 2: "
            "'Start the room's cluster', has one to copy)"
        )
    toml = _toml()
    try:
        data = toml.loads(path.read_text())
    except toml.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML ({exc}): fix that line") from None
    unknown = sorted(set(data) - set(_KNOWN))
    if unknown:
        raise ValueError(f"{path}: unknown table(s) {', '.join(unknown)}; use {sorted(_KNOWN)}")
    controller, defaults, ssh, mpi = (
        data.get("controller", {}),
        data.get("defaults", {}),
        data.get("ssh", {}),
        data.get("mpi", {}),
    )
    tables = (("controller", controller), ("defaults", defaults), ("ssh", ssh), ("mpi", mpi))
    for name, table in tables:
        _check_keys(table, name, str(path))
    pcs = []
    for entry in data.get("pc", []):
        _check_keys(entry, "pc", str(path))
        pcs.append(
            LabPC(
                host=str(entry.get("host", "")),
                engines=int(entry.get("engines", defaults.get("engines", 1))),
                python=str(entry.get("python", defaults.get("python", ""))),
            )
        )
    return LabHosts(
        pcs=tuple(pcs),
        controller_ip=str(controller.get("ip", "*")),
        profile=str(controller.get("profile", "lab")),
        seat=_seat_size(controller.get("seat"), path),
        ssh=tuple(ssh.get("command", ["ssh"])),
        scp=tuple(ssh.get("scp", ["scp"])),
        mpi_ranks=int(mpi.get("ranks", 0)),
        path=path,
    )
