"""The grader checks itself before grading anyone (the kit job ``./kit grade``).

A grading machine that cannot run the checks would give every student 0 with an error that
blames nobody. So before the first submission: the sandboxed kernel must start and import what
each assignment's kernel-side cells import (the kit, ipyparallel, ...), and on A1 a known answer
must PASS and a stub must FAIL through the whole path (probe cells, data back, the grader's
check). Otherwise :func:`preflight` raises :class:`GradingMachineError` with one line that
blames the grading machine and names what to fix.
"""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import json
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from course_lib.grading.cells import UNGRADED_HINT, answer_id, check_id, stub_solution
from course_lib.grading.grade import GradingLimits, grade_notebook
from course_lib.grading.guard import parse_python
from course_lib.grading.probes.registry import probe_spec
from course_lib.grading.runner import run_nbval
from course_lib.grading.sandbox import SandboxLimits, kit_package

__all__ = ["GradingMachineError", "kit_import_hint", "preflight"]


class GradingMachineError(RuntimeError):
    """The grading machine cannot grade: its message is one line naming what to fix."""


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

    For A2 (checks in the grader, engines in the kernel) that includes its check cells' imports
    of ``course_lib.checks``, which its kernel is not shown: those are left out."""
    statements: list[str] = []
    for nb in sources.values():
        spec = probe_spec(nb)
        if spec is not None and not spec.kit:
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
                    if spec is not None and "course_lib.checks" in line:
                        continue
                    if line not in statements:
                        statements.append(line)
    return statements


def _imports_work(statements: list[str], sandbox: SandboxLimits | None, seconds: float) -> None:
    """Run the import statements in a sandboxed kernel; raise GradingMachineError if one fails."""
    if not statements:
        return
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(line) for line in statements]
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
        path = Path(tmp) / "imports.ipynb"
        nbformat.write(nb, path)
        results = run_nbval(path, seconds, 4 * seconds, sandbox=sandbox)
    if results is None:
        raise GradingMachineError(
            f"grading machine: the sandboxed kernel did not import the checks' modules in "
            f"{4 * seconds:g} s: the machine is too loaded, or the kernel cannot start"
        )
    for number, line in enumerate(statements):
        outcome, message = results.get(number, ("error", "the kernel did not start"))
        if outcome == "passed":
            continue
        error = next(
            (m.strip() for m in reversed(message.splitlines()) if "Error" in m), message.strip()
        )
        hint = kit_import_hint() if "course_lib" in error else "is it installed in the venv?"
        raise GradingMachineError(
            f"grading machine: the sandboxed kernel cannot run `{line}` ({error[:160]}); {hint}"
        )


def _known_answers(pristine: nbformat.NotebookNode, sandbox: SandboxLimits | None) -> None:
    """Grade the source's answers with one stubbed: the others PASS, the stub FAILs, or raise."""
    exercises = [check_id(c) for c in pristine.cells if check_id(c) is not None]
    stubbed = exercises[-1]  # the last: no other exercise uses it
    known = copy.deepcopy(pristine)
    for cell in known.cells:
        if answer_id(cell) == stubbed:
            cell.source = stub_solution(cell.source, stubbed, UNGRADED_HINT)
    assignment = pristine.metadata["course"]["assignment"]
    rows = grade_notebook(
        "selfcheck", assignment, pristine, known, GradingLimits(120, 400), sandbox=sandbox
    )
    for row in rows:
        want_pass = row.exercise != stubbed
        if (row.points > 0) != want_pass or (not want_pass and "not implemented" not in row.reason):
            what = "the known answer" if want_pass else "a stub"
            raise GradingMachineError(
                f"grading machine: {assignment} {row.exercise}: {what} got {row.points:g} points "
                f"({row.reason[:160]}); the grader itself is broken here, no student is graded"
            )


def preflight(
    sources: dict[str, nbformat.NotebookNode],
    sandbox: SandboxLimits | None,
    cell_seconds: float = 120.0,
) -> float:
    """Check the grading machine before grading; return its seconds, or raise one line."""
    started = time.perf_counter()
    _imports_work(_kernel_imports(sources), sandbox, cell_seconds)
    # One assignment decided by the grader, without engines (A1): seconds, not a minute.
    light = [nb for nb in sources.values() if (spec := probe_spec(nb)) and not spec.kit]
    if light:
        _known_answers(light[0], sandbox)
    return time.perf_counter() - started
