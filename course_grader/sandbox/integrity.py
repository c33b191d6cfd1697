"""No lecture (the grader). Integrity, the second line behind the sandbox: what grading must never change, checked often.

Before grading, :class:`EnvironmentGuard` fingerprints the kit's package, the instructor sources
and the virtual environment's ``site-packages`` (every file's size, mode, mtime and ctime; the
content hash of every ``.py`` and ``.pth``, and of every file of the kit and sources), and keeps
a pristine copy of the kit and the sources. After each notebook the grader compares. A change
in the kit or the sources is put back from the copy; a file added to the venv is deleted; a venv
file changed or deleted cannot be put back (the venv is too large to copy), so grading stops
and says which files to reinstall. The ctime cannot be set by a process, so a file written and
given back its old mtime still shows.

The kit and the grader are byte-compiled before the fingerprint: a ``.pyc`` left stale by an
edit to the kit (a ``git pull`` before grading) is rewritten by the first notebook that imports
the module, which would read as that notebook changing the kit and cost an honest student the grade.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

__all__ = ["EnvironmentGuard", "EnvironmentNotRestorable", "fingerprint"]

Entry = tuple[int, int, int, int, str]  # size, mode, mtime_ns, ctime_ns, sha256 ("" = not hashed)


class EnvironmentNotRestorable(RuntimeError):
    """A file of the virtual environment was changed or deleted: grading cannot go on."""


def _digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fingerprint(
    root: Path, hash_all: bool, previous: dict[str, Entry] | None = None
) -> dict[str, Entry]:
    """Return {relative path: entry} for every file under ``root`` (links as files).

    A file whose size, mode, mtime and ctime equal its entry in ``previous`` keeps that hash
    unread: no process can write a file without its ctime changing.
    """
    previous = previous or {}
    found: dict[str, Entry] = {}
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                st = entry.stat(follow_symlinks=False)
                rel = entry.path[len(str(root)) + 1 :]
                stat = (st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
                old = previous.get(rel)
                if old is not None and old[:4] == stat:
                    found[rel] = old
                    continue
                hashed = entry.is_file(follow_symlinks=False)
                hashed = hashed and (hash_all or entry.name.endswith((".py", ".pth")))
                found[rel] = (*stat, _digest(entry.path) if hashed else "")
    return found


def _compare(before: dict[str, Entry], after: dict[str, Entry]) -> dict[str, str]:
    """Return {relative path: "added" | "changed" | "removed"}."""
    diff = {}
    for rel in before.keys() | after.keys():
        if rel not in after:
            diff[rel] = "removed"
        elif rel not in before:
            if "__pycache__" not in rel:  # Python caches what it imports, unsandboxed
                diff[rel] = "added"
        elif before[rel] != after[rel]:
            diff[rel] = "changed"
    return diff


class EnvironmentGuard:
    """Fingerprint the kit, the sources and the venv; report, and undo, any change to them."""

    def __init__(
        self,
        kit: Path,
        sources: Path,
        site_packages: Path | None = None,
        grader: Path | None = None,
    ) -> None:
        site = Path(site_packages or sysconfig.get_paths()["purelib"])
        # (name, folder, hash every file, a pristine copy kept)
        self.roots = [
            ("kit", Path(kit), True),
            *([("grader", Path(grader), True)] if grader is not None else []),
            ("sources", Path(sources), True),
            ("venv", site, False),
        ]
        for name, path, _full in self.roots:
            if name in ("kit", "grader"):  # nothing left for an honest import to write
                compileall.compile_dir(path, quiet=2)
        self.prints = {name: fingerprint(path, full) for name, path, full in self.roots}
        self._copy = Path(tempfile.mkdtemp(prefix="grading-pristine-"))
        for name, path, full in self.roots:
            if full:
                shutil.copytree(path, self._copy / name, symlinks=True)

    def changes(self) -> list[str]:
        """Return what changed since the fingerprint, e.g. ``["grader: changed assignments/a1/checks.py"]``."""
        found = []
        for name, path, full in self.roots:
            diff = _compare(self.prints[name], fingerprint(path, full, self.prints[name]))
            found += [f"{name}: {how} {rel}" for rel, how in sorted(diff.items())]
        return found

    def restore(self) -> None:
        """Put every fingerprinted file back; raise EnvironmentNotRestorable where it cannot."""
        for name, path, full in self.roots:
            diff = _compare(self.prints[name], fingerprint(path, full, self.prints[name]))
            lost = [rel for rel, how in diff.items() if how != "added" and not full]
            if lost:
                raise EnvironmentNotRestorable(
                    f"a graded notebook changed {len(lost)} file(s) of the virtual environment "
                    f"({', '.join(sorted(lost)[:5])}) that the grader keeps no copy of: "
                    f"reinstall it (./kit setup, or pip install --force-reinstall) before grading"
                )
            for rel, how in diff.items():
                target = path / rel
                if how == "added":
                    target.unlink(missing_ok=True)
                    continue
                target.unlink(missing_ok=True)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(self._copy / name / rel, target, follow_symlinks=False)
            self.prints[name] = fingerprint(path, full)  # ctimes of restored files are new
        if self.changes():
            raise EnvironmentNotRestorable(f"could not restore: {self.changes()[:5]}")

    def close(self) -> None:
        """Remove the pristine copy."""
        shutil.rmtree(self._copy, ignore_errors=True)

    def __enter__(self) -> EnvironmentGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
