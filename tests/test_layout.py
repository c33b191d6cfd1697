"""The house's floor plan, read from the source (no imports run): packages, layers, cycles, dead paths.

``../shared/DESIGN.md`` ("Where code lives"): three packages by audience, imports running one
way between them — the teaching library (``course_lib``) imports neither the grader
(``course_grader``) nor the lab (``course_kit``); the grader imports the library; the lab imports
both. Inside the library the cluster and the communicator sit at the bottom and the lecture
checks on top; no two modules of any package import each other. Every import and every dotted or
slashed path of the three packages in the code, the tests, the benchmarks, the notebooks and the
README must name a module (and a name) that exists, so a move that forgot one place fails here
rather than in a student's notebook.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "course_lib"
#: The three packages, each with the packages it may import (besides itself).
PACKAGES = {
    "course_lib": set(),
    "course_grader": {"course_lib"},
    "course_kit": {"course_lib", "course_grader"},
}

#: Layer of each top-level package of course_lib; a module may import only its layer or below.
LAYERS = {
    "cluster": 0, "comm": 0, "files": 0, "i18n": 0, "timing": 0,
    "collectives": 1, "compression": 1, "cost_model": 1, "data": 1, "checkpoint": 1,
    "training": 2,
    "parallel": 3,
    "papers": 4,
    "checks": 5, "demo": 5, "teaching": 5,
}  # fmt: skip


def module_name(path: Path) -> str:
    """Return the dotted module name of a file under the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _in_type_checking(node: ast.AST) -> bool:
    """Return True for an ``if TYPE_CHECKING:`` block (imports for the type checker)."""
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(source: str, package: str) -> list[tuple[str, str | None, int]]:
    """Return ``(module, name or None, line)`` for each import, at any depth, of the kit's packages.

    Imports of the three packages only. ``from a.b import c`` gives ``("a.b", "c")``;
    ``import a.b`` gives ``("a.b", None)``.
    Relative imports are resolved against ``package``; ``TYPE_CHECKING`` blocks are skipped.
    """
    if "course_" not in source and "from ." not in source:
        return []  # no import of the kit's packages can be in it: no need to parse it
    out, todo = [], [ast.parse(source)]
    while todo:  # one walk, not entering TYPE_CHECKING blocks
        node = todo.pop()
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            out += [(base, a.name, node.lineno) for a in node.names]
        elif _in_type_checking(node):
            todo.extend(node.orelse)  # its ``else:`` runs
        else:
            todo.extend(ast.iter_child_nodes(node))
    out.sort(key=lambda found: found[2])  # in the source's order, as before
    return [(m, n, line) for m, n, line in out if m.split(".")[0] in PACKAGES]


@functools.cache  # asked for once per import and path that names the module: parse it once
def defined_names(module: str) -> frozenset[str]:
    """Return the names a module defines or imports at its top level (from its source)."""
    tree = ast.parse(MODULES[module].read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return frozenset(names)


def target_module(module: str, name: str | None) -> str:
    """Return the module an import statement reaches (``from pkg import sub`` reaches ``pkg.sub``)."""
    if name and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


@functools.cache  # three tests read it; the sources do not change during a run
def library_graph() -> dict[str, set[str]]:
    """Return each library module's set of imported library modules (self-imports left out)."""
    graph: dict[str, set[str]] = {}
    for mod, path in MODULES.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        graph[mod] = {target_module(m, n) for m, n, _ in imports_of(path.read_text(), package)}
        graph[mod].discard(mod)
    return graph


def layer(module: str) -> int:
    """Return the layer of a library module (its top-level package under course_lib)."""
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else -1


def test_every_top_level_package_has_a_layer():
    tops = {m.split(".")[1] for m in MODULES if m.startswith("course_lib.")}
    assert tops <= set(LAYERS), f"give these a layer in LAYERS: {sorted(tops - set(LAYERS))}"


def imports_across_packages(graph: dict[str, set[str]]) -> list[str]:
    """Return each import of a package that the importing module's package may not import."""
    return sorted(
        f"{mod} imports {dep}"
        for mod, deps in graph.items()
        for dep in deps
        if (home := mod.split(".")[0]) != (other := dep.split(".")[0])
        and other not in PACKAGES[home]
    )


def test_the_packages_import_one_way():
    across = imports_across_packages(library_graph())
    assert not across, (
        "the library imports neither the grader nor the lab; the grader not the lab:\n"
        + "\n".join(across)
    )


def test_the_package_check_flags_a_planted_import_of_the_grader():
    planted = "from course_grader.grade import grade_notebook\nfrom course_lib.comm import stats\n"
    deps = {target_module(m, n) for m, n, _ in imports_of(planted, "course_lib.comm")}
    assert imports_across_packages({"course_lib.comm.communicator": deps}) == [
        "course_lib.comm.communicator imports course_grader.grade"
    ]
    lazy = "def f():\n    from course_kit.jobs.table import JOBS\n"
    deps = {target_module(m, n) for m, n, _ in imports_of(lazy, "course_grader")}
    assert imports_across_packages({"course_grader.grade": deps}) == [
        "course_grader.grade imports course_kit.jobs.table"
    ]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Return each import in ``graph`` of a library module of a higher layer, described."""
    return sorted(
        f"{mod} (layer {layer(mod)}) imports {dep} (layer {layer(dep)})"
        for mod, deps in graph.items()
        for dep in deps
        if dep in MODULES
        and mod.startswith("course_lib.")
        and dep.startswith("course_lib.")
        and layer(dep) > layer(mod)
    )


def test_no_module_imports_a_higher_layer():
    upward = upward_imports(library_graph())
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_the_layer_check_flags_a_planted_upward_import():
    planted = "from course_lib.parallel.exchanges import base\nfrom course_lib.comm import stats\n"
    deps = {target_module(m, n) for m, n, _ in imports_of(planted, "course_lib.comm")}
    assert upward_imports({"course_lib.comm.communicator": deps}) == [
        "course_lib.comm.communicator (layer 0) imports course_lib.parallel.exchanges.base (layer 3)"
    ]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    cycles = strongly_connected(library_graph())
    assert not cycles, "modules that import each other: " + "; ".join(map(" <-> ".join, cycles))


def test_the_cycle_detector_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def _sources() -> list[tuple[str, str]]:
    """Return ``(where, python source)`` for the tests, benchmarks, the lectures' instructor answers
    (``assignments/source/lectures/*.py``) and every notebook's code."""
    out = [
        (str(p.relative_to(ROOT)), p.read_text())
        for p in [
            *(ROOT / "tests").rglob("*.py"),
            *(ROOT / "bench").rglob("*.py"),
            *(ROOT / "assignments").rglob("*.py"),
        ]
    ]
    for nb in [*(ROOT / "notebooks").rglob("*.ipynb"), *(ROOT / "assignments").rglob("*.ipynb")]:
        if ".ipynb_checkpoints" in nb.parts:  # JupyterLab's copies, not the course's
            continue
        for k, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                code = "".join(cell["source"])
                code = "\n".join(
                    "pass" if line.lstrip().startswith(("%", "!")) else line
                    for line in code.splitlines()
                )
                out.append((f"{nb.relative_to(ROOT)} cell {k}", code))
    return out


def dead_imports(module: str, name: str | None) -> str | None:
    """Return why ``from module import name`` (or ``import module``) names nothing, else None."""
    if module not in MODULES:
        return f"no module {module}"
    if name is None or name == "*" or f"{module}.{name}" in MODULES:
        return None
    if name not in defined_names(module):
        return f"{module} defines no {name}"
    return None


def test_every_import_names_a_module_and_a_name_that_exist():
    dead = []
    for mod, path in MODULES.items():
        dead += [
            (str(path.relative_to(ROOT)), line, m, n)
            for m, n, line in imports_of(path.read_text(), mod.rpartition(".")[0])
        ]
    for where, source in _sources():
        dead += [(where, line, m, n) for m, n, line in imports_of(source, "")]
    wrong = [f"{where}:{line}: {why}" for where, line, m, n in dead if (why := dead_imports(m, n))]
    assert not wrong, "imports of things that do not exist:\n" + "\n".join(wrong)


def test_the_import_scan_reads_the_lectures_answers():
    where = {w for w, _ in _sources()}
    answers = sorted((ROOT / "assignments" / "source" / "lectures").glob("*.py"))
    assert answers and {str(p.relative_to(ROOT)) for p in answers} <= where


def test_the_import_scan_skips_what_only_the_type_checker_reads():
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from course_lib.nope import A\n"
        "else:\n    from course_lib.comm import B\ndef f():\n    import course_kit.jobs\n"
    )
    assert imports_of(source, "") == [("course_lib.comm", "B", 5), ("course_kit.jobs", None, 7)]


def test_the_import_scan_flags_a_moved_module():
    source = "from course_lib.parallel.exchange import GradientExchange\n"
    ((m, n, _),) = imports_of(source, "")
    assert dead_imports(m, n) == "no module course_lib.parallel.exchange"
    ((m, n, _),) = imports_of("from course_lib.parallel.exchanges.base import Nope\n", "")
    assert dead_imports(m, n) == "course_lib.parallel.exchanges.base defines no Nope"


DOTTED = re.compile(r"course_(?:lib|grader|kit)(?:\.[A-Za-z_][A-Za-z_0-9]*)+")
SLASHED = re.compile(r"(?<!\.cache/)course_(?:lib|grader|kit)(?:/[A-Za-z_][A-Za-z_0-9]*)+(?:\.py)?")


def dead_path(text: str) -> str | None:
    """Return why a dotted or slashed path of the kit's packages names nothing, else None."""
    if "/" in text:
        path = ROOT / text
        return None if path.exists() or path.with_suffix(".py").exists() else f"no file {text}"
    parts = text.split(".")
    longest = max(
        (k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in MODULES), default=0
    )
    if longest < 2 and len(parts) > 1 and parts[1] != "__file__":
        return f"no module {'.'.join(parts[:2])}"
    if longest < len(parts):
        module, name = ".".join(parts[:longest]), parts[longest]
        if name not in defined_names(module) and name not in ("__file__", "__doc__", "__path__"):
            package = MODULES[module].name == "__init__.py"
            return f"no module {module}.{name}" if package else f"{module} defines no {name}"
    return None


@pytest.mark.parametrize(
    "folder",
    [*PACKAGES, "tests", "bench", "notebooks", "assignments", "docs", "README.md"],
)
def test_every_course_lib_path_in_text_exists(folder):
    files = (
        [ROOT / folder]
        if folder.endswith(".md")
        else [
            p
            for p in (ROOT / folder).rglob("*")
            if p.suffix in (".py", ".ipynb", ".md")
            # this file names old paths on purpose; that one builds a made-up assignment (A99)
            and p.name not in (Path(__file__).name, "test_new_assignment.py")
            and ".ipynb_checkpoints" not in p.parts
        ]
    )
    wrong = set()
    for f in files:
        text = re.sub(r'getLogger\("[^"]*"\)', "", f.read_text())  # logger names are not paths
        for match in [*DOTTED.findall(text), *SLASHED.findall(text)]:
            if why := dead_path(match.rstrip(".")):
                wrong.add(f"{f.relative_to(ROOT)}: {match}: {why}")
    assert not wrong, "paths that name nothing:\n" + "\n".join(sorted(wrong))


def test_the_path_scan_flags_an_old_path():
    assert dead_path("course_lib.parallel.replica") == "no module course_lib.parallel.replica"
    assert dead_path("course_lib/parallel/replica.py") == "no file course_lib/parallel/replica.py"
    assert (
        dead_path("course_lib.training.loop.no_such")
        == "course_lib.training.loop defines no no_such"
    )
    assert dead_path("course_lib.parallel.data_parallel.replica.engine_train") is None


#: A module longer than this holds two ideas unless its docstring says why it is one ("Kept whole:
#: ..."). Folders are split by idea, not by a count of modules (DESIGN, "Where code lives").
LONG_MODULE_LINES = 300


def long_modules_without_a_reason() -> list[str]:
    """Return the modules of the three packages over ``LONG_MODULE_LINES`` that give no reason."""
    return sorted(
        f"{mod} ({n} lines)"
        for mod, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > LONG_MODULE_LINES
        and "Kept whole:" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    )


def test_a_long_module_says_why_it_is_one():
    long = long_modules_without_a_reason()
    assert not long, (
        "split these by idea, or say in the docstring why each is one ('Kept whole: ...'): "
        + ", ".join(long)
    )


#: How a module's docstring says whom it serves: a lecture by number ("Lecture 4:", "lectures 5-6"),
#: every lecture, an assignment ("A3"), or, for the kit's plumbing and the grader, no lecture.
SERVES = re.compile(r"\blectures? \d+|\bevery lecture\b|\bno lecture\b|\bA\d\b", re.IGNORECASE)


def names_whom_it_serves(source: str) -> bool:
    """Return True when a module's docstring names its lecture(s), an assignment or no lecture."""
    return bool(SERVES.search(ast.get_docstring(ast.parse(source)) or ""))


def test_every_module_docstring_names_the_lecture_it_serves():
    silent = sorted(m for m, p in MODULES.items() if not names_whom_it_serves(p.read_text()))
    assert not silent, (
        "say in the docstring which lecture each serves ('Lecture 4: ...'), or 'no lecture' "
        "for the kit's plumbing: " + ", ".join(silent)
    )


def test_the_lecture_scan_flags_a_docstring_that_names_none():
    assert not names_whom_it_serves('"""Helpers for the engines: a lecture may use them."""')
    assert not names_whom_it_serves("import os\n")  # no docstring at all
    assert names_whom_it_serves('"""Lectures 5-6: Local-SGD simulated in one process."""')
    assert names_whom_it_serves('"""No lecture (the kit\'s plumbing): ``./kit test``."""')
    assert names_whom_it_serves('"""Checks of assignment A4."""')


def lecture_trip() -> dict[int, str]:
    """Return the README's "where each lecture's algorithm lives" table: lecture -> path."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Where each lecture's algorithm lives", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| (\d+) [^|]+\| `([^`]+)` \|$", section, re.M)
    return {int(n): path for n, path in rows}


def test_the_readme_names_a_path_that_exists_for_every_lecture():
    trip = lecture_trip()
    lectures = sorted(int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(trip) == lectures, "one line per lecture in the README's layout table"
    missing = [f"lecture {n}: {path}" for n, path in trip.items() if not (ROOT / path).is_file()]
    assert not missing, f"paths that do not exist: {missing}"
