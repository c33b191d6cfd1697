"""No lecture (the grader). The grader checks itself before grading anyone (``./kit grade``).

A grading machine that cannot run the checks would give every student 0 with an error that
blames nobody. So before the first submission: the sandboxed kernel must start and import what
each assignment's kernel-side cells import (the kit, ipyparallel, ...), and for every assignment
about to be graded, the instructor's answers with the last exercise stubbed are graded through
the whole path (sandboxed kernel, its engines, probe data back, the grader's judge): the known
answers must get their points and the stub 0, "not implemented". Otherwise :func:`preflight`
raises :class:`GradingMachineError` with one line that blames the grading machine.

A passed known-answer run is remembered (:func:`selfcheck_key`): keyed on the contents of the
kit's files and of the assignment's source, the Python and package versions and the sandbox
settings, stored on the grader's side (the user's cache folder, which no sandbox is shown),
written atomically and read only as a small regular file. Anything else is no cache. The import
check always runs: it is what a moved or re-linked venv breaks.

Kept whole: one preflight: the import check, the known answers, the key that remembers them.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nbformat

from course_grader.cells import UNGRADED_HINT, answer_id, check_id, stub_solution
from course_grader.grade import GradingLimits, grade_notebook
from course_grader.gradebook import assignment_of, find_submissions
from course_grader.registry import probe_spec
from course_grader.runner import run_nbval
from course_grader.sandbox.config import SandboxLimits, grader_package, kit_package
from course_grader.sandbox.wire_audit import wire_problem_here
from course_grader.verdict.guard import parse_python
from course_grader.verdict.probe import convert_notebook
from course_lib.files import atomic_write_bytes

__all__ = [
    "GradingMachineError",
    "SelfCheck",
    "assignments_to_grade",
    "default_cache",
    "kit_digest",
    "kit_import_hint",
    "preflight",
    "remember",
    "remembered",
    "selfcheck_key",
]

#: Packages whose version changes what a graded run does (the key of a cached self-check).
_PACKAGES = ("torch", "numpy", "ipyparallel", "ipykernel", "jupyter_client", "nbval", "pyzmq")
_CACHE_FORMAT = "course-selfcheck-1"


class GradingMachineError(RuntimeError):
    """The grading machine cannot grade: its message is one line naming what to fix."""


@dataclasses.dataclass(frozen=True)
class SelfCheck:
    """What :func:`preflight` did: its seconds, each assignment's, and which came from the cache."""

    seconds: float
    assignments: dict[str, float]  # assignment -> seconds of its known-answer run (0: cached)
    cached: tuple[str, ...]

    def summary(self) -> str:
        """One line: the total time, then each assignment's time or that it was cached."""
        parts = [
            f"{a} from the cache" if a in self.cached else f"{a} {s:.0f} s"
            for a, s in self.assignments.items()
        ]
        what = f" ({', '.join(parts)})" if parts else " (imports only: nothing to grade)"
        return f"the grading machine checked itself in {self.seconds:.0f} s{what}"


def kit_import_hint() -> str:
    """Say why a sandboxed kernel may not find the kit: where the venv's install points."""
    shown = kit_package()
    hint = f"the sandbox shows the kit at {shown}"
    prefix = Path(sys.prefix)
    if prefix.is_symlink() or prefix.resolve() != prefix:
        hint += f"; the venv {prefix} is a link to {prefix.resolve()}"
    try:
        direct = importlib.metadata.distribution("course_lib").read_text("direct_url.json")
        url = json.loads(direct or "{}").get("url", "")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        url = ""
    if url.startswith("file://") and Path(url[7:]).resolve() != shown.parent.resolve():
        hint += f", whose editable install of course_lib points to {url[7:]}, not this checkout"
    return hint + ": run ./kit setup in this checkout (its own .venv), or grade from " + url[7:]


def _kernel_imports(sources: dict[str, nbformat.NotebookNode]) -> list[str]:
    """The import statements of the set-up and check cells of assignments whose kernel has the kit.

    Their check cells' imports of the checks (``course_grader``), which no kernel is shown, are
    left out: the probes replace those cells."""
    statements: list[str] = []
    for nb in sources.values():
        spec = probe_spec(nb)
        if not spec.kit:
            continue  # its checks run in the grader, its kernel imports no kit
        for cell in nb.cells:
            if cell.cell_type != "code" or answer_id(cell):
                continue
            try:
                tree = parse_python(cell.source)
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    line = ast.unparse(node)
                    if "course_grader" in line or "course_lib.checks" in line:
                        continue
                    if line not in statements:
                        statements.append(line)
    return statements


def _failing_import(
    statements: list[str], sandbox: SandboxLimits | None, seconds: float, **view: Any
) -> tuple[str, str] | None:
    """Run the import statements in a sandboxed kernel; return (statement, error) of the first
    that fails, or None. ``view``: what the sandbox shows (``run_nbval``'s hidden, blocked, kit)."""
    if not statements:
        return None
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(line) for line in statements]
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
        path = Path(tmp) / "imports.ipynb"
        nbformat.write(nb, path)
        results = run_nbval(path, seconds, 4 * seconds, sandbox=sandbox, **view)
    if results is None:
        raise GradingMachineError(
            f"grading machine: the sandboxed kernel did not import the checks' modules in "
            f"{4 * seconds:g} s: the machine is too loaded, or the kernel cannot start"
        )
    for number, line in enumerate(statements):
        outcome, message = results.get(number, ("error", "the kernel did not start"))
        if outcome != "passed":
            lines = reversed(message.splitlines())
            error = next((m.strip() for m in lines if "Error" in m), message.strip())
            return line, " ".join(error.split())[:160]
    return None


def _imports_work(statements: list[str], sandbox: SandboxLimits | None, seconds: float) -> None:
    """Run the import statements in a sandboxed kernel; raise GradingMachineError if one fails."""
    failed = _failing_import(statements, sandbox, seconds)
    if failed is not None:
        line, error = failed
        hint = kit_import_hint() if "course_lib" in error else "is it installed in the venv?"
        raise GradingMachineError(
            f"grading machine: the sandboxed kernel cannot run `{line}` ({error}); {hint}"
        )


def _why_setup_failed(
    pristine: nbformat.NotebookNode, graded: nbformat.NotebookNode, sandbox: SandboxLimits | None
) -> str:
    """Name the first import the assignment's own kernel cannot run (as graded: its set-up and
    probes, in its own view of the kit), or "" when they all import: why a known answer failed."""
    spec = probe_spec(pristine)
    graded = convert_notebook(copy.deepcopy(graded), spec, 0)
    forbidden = pristine.metadata.get("course", {}).get("forbidden_imports", [])
    view: dict[str, Any] = {
        "hidden": tuple(str(kit_package().parent / part) for part in spec.kit_hidden),
        "blocked": tuple(forbidden) if spec.blocked else (),
        "kit": spec.kit,
        "cut": spec.kit_cut,
    }
    statements: list[str] = []
    for cell in graded.cells:
        try:
            tree = parse_python(cell.source) if cell.cell_type == "code" else None
        except SyntaxError:
            continue
        for node in ast.walk(tree) if tree is not None else ():  # the probes import inside
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if (line := ast.unparse(node)) not in statements:
                    statements.append(line)
    try:
        failed = _failing_import(statements, sandbox, 60.0, **view)
    except GradingMachineError:
        return ""
    return f"; its kernel cannot run `{failed[0]}` ({failed[1]})" if failed else ""


def _known_answers(
    assignment: str,
    pristine: nbformat.NotebookNode,
    sandbox: SandboxLimits | None,
    seconds: float,
) -> None:
    """Grade the source's answers with one stubbed: the others PASS, the stub FAILs, or raise."""
    exercises = [check_id(c) for c in pristine.cells if check_id(c) is not None]
    if not exercises:
        return  # nothing is graded in it
    stubbed = exercises[-1]  # the last: no other exercise uses it
    known = copy.deepcopy(pristine)
    for cell in known.cells:
        if answer_id(cell) == stubbed:
            cell.source = stub_solution(cell.source, stubbed, UNGRADED_HINT)
    limits = GradingLimits(seconds, max(400.0, 4 * seconds))
    rows = grade_notebook("selfcheck", assignment, pristine, known, limits, sandbox=sandbox)
    for row in rows:
        want_pass = row.exercise != stubbed
        if (row.points > 0) != want_pass or (not want_pass and "not implemented" not in row.reason):
            what = "the known answer" if want_pass else "a stub"
            reason = " ".join(row.reason.split())[:200]  # one line, whatever the kernel printed
            raise GradingMachineError(
                f"grading machine: {assignment} {row.exercise}: {what} got {row.points:g} points "
                f"({reason}){_why_setup_failed(pristine, known, sandbox)}; the grader itself "
                f"is broken for {assignment}, no student is graded"
            )


def assignments_to_grade(submissions: Path, sources: dict[str, nbformat.NotebookNode]) -> list[str]:
    """Return the assignments of the submissions under ``submissions``, in the sources' order.

    Found as :func:`course_grader.gradebook.grade_folder` finds them (release stamp, else
    file name); a notebook that is none of them is graded as such and needs no self-check.
    """
    found = set()
    for _student, path in find_submissions(submissions):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - unreadable: the grader goes by its file name too
            nb = None
        try:
            found.add(assignment_of(path, nb, sources))
        except ValueError:
            continue
    return [a for a in sources if a in found]


def default_cache() -> Path:
    """The folder of remembered self-checks: the user's cache folder, which no sandbox sees."""
    base = os.environ.get("XDG_CACHE_HOME") or os.environ.get("LOCALAPPDATA")
    return Path(base or Path.home() / ".cache") / "course_kit" / "selfcheck"


def kit_digest(kit: Path | None = None, grader: Path | None = None) -> str:
    """Return the SHA-256 of the kit's and the grader's files (paths and contents; no compiled files)."""
    digest = hashlib.sha256()
    for root in (Path(kit or kit_package()), Path(grader or grader_package())):
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file() or path.suffix == ".pyc":
                continue
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}".encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _versions() -> dict[str, str | None]:
    """Python's version and the installed versions of :data:`_PACKAGES` (None: not installed)."""
    found: dict[str, str | None] = {"python": sys.version, "executable": sys.executable}
    for name in _PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def selfcheck_key(
    pristine: nbformat.NotebookNode, sandbox: SandboxLimits, kit_sha: str | None = None
) -> str:
    """Return the key of a remembered self-check: kit, source, versions and sandbox settings."""
    facts = {
        "format": _CACHE_FORMAT,
        "kit": kit_sha or kit_digest(),
        "source": hashlib.sha256(nbformat.writes(pristine).encode()).hexdigest(),
        "versions": _versions(),
        "sandbox": dataclasses.asdict(sandbox),
        "wire": wire_problem_here(),  # whether the bytes on the wire are audited, and why not
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def remembered(cache: Path, key: str) -> bool:
    """Whether ``cache`` holds a passed self-check under ``key``; anything unreadable: no."""
    path = cache / f"{key}.json"
    try:
        info = os.lstat(path)  # never follow a link, never open a FIFO or a device
        if not stat.S_ISREG(info.st_mode) or info.st_size > 4096:
            return False
        entry = json.loads(path.read_text(encoding="utf-8"))
        return isinstance(entry, dict) and entry.get("key") == key and entry.get("passed") is True
    except (OSError, ValueError):
        return False


def remember(cache: Path, key: str, assignment: str, seconds: float) -> None:
    """Store a passed self-check under ``key``, atomically; a cache that cannot be written is skipped."""
    entry = {"key": key, "passed": True, "assignment": assignment, "seconds": round(seconds, 1)}
    try:
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_bytes(cache / f"{key}.json", json.dumps(entry).encode())
    except OSError:
        pass  # remembering is an optimisation: the next run checks again


def preflight(
    sources: dict[str, nbformat.NotebookNode],
    sandbox: SandboxLimits | None,
    assignments: Iterable[str] = (),
    cell_seconds: float = 120.0,
    cache: Path | None = None,
    jobs: int = 1,
) -> SelfCheck:
    """Check the grading machine for ``assignments`` before grading; return what it did, or raise.

    ``cache``: the folder of remembered passes (None: check every assignment afresh). Used only
    with a sandbox: unisolated, an answer could have written the cache itself.
    ``jobs``: assignments checked at once.
    """
    started = time.perf_counter()
    _imports_work(_kernel_imports(sources), sandbox, cell_seconds)
    wanted = [a for a in sources if a in set(assignments)]
    cache = cache if sandbox is not None else None
    kit_sha = kit_digest() if cache is not None and wanted else ""
    keys = {a: selfcheck_key(sources[a], sandbox, kit_sha) for a in wanted} if kit_sha else {}
    cached = tuple(a for a in wanted if cache is not None and remembered(cache, keys[a]))

    def check(assignment: str) -> float:
        began = time.perf_counter()
        _known_answers(assignment, sources[assignment], sandbox, cell_seconds)
        took = time.perf_counter() - began
        if cache is not None:
            remember(cache, keys[assignment], assignment, took)
        return took

    fresh = [a for a in wanted if a not in cached]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {a: pool.submit(check, a) for a in fresh}
        try:  # in the sources' order: the first assignment that failed is the one named
            took = {a: futures[a].result() for a in fresh}
        except BaseException:
            for future in futures.values():
                future.cancel()  # those not started yet; the running ones finish
            raise
    return SelfCheck(
        time.perf_counter() - started,
        {a: took.get(a, 0.0) for a in wanted},
        cached,
    )
