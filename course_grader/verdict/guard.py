"""Refuse answer cells that reach for the checks instead of solving the exercise.

The grader pastes a student's answer cell into the instructor's copy, where it runs in the same
kernel as the check cells. An answer that rebinds ``check_sgd_momentum`` (or ``print``, or the
``cluster`` the A2 checks run on), patches ``np.allclose`` or rewrites later cells through
``get_ipython()`` would make a wrong answer print PASS. :func:`answer_problem` reads the cell with
``ast`` before it is pasted and names the first such thing it finds; the grader then grades the
exercise as unanswered, with that reason.

This is a guard against rewriting the verdict inside the kernel. Files, processes and network
are the sandbox's business (:mod:`course_grader.sandbox.config`): there the kernel sees no
solutions and changes nothing outside its own throwaway folder.

Kept whole: one ast walk; the binding and import helpers serve ``answer_problem`` alone.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from course_grader.cells import answer_id, check_id
from course_lib.i18n import _

if TYPE_CHECKING:
    from nbformat import NotebookNode

__all__ = [
    "FORBIDDEN_MODULES",
    "FORBIDDEN_NAMES",
    "LIBRARY_ALLOWED",
    "answer_problem",
    "parse_python",
    "protected_names",
    "rejected_answers",
]

# Builtins that reach into namespaces or run code built from strings.
FORBIDDEN_NAMES = frozenset(
    {
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "exec",
        "eval",
        "compile",
        "__import__",
        "__builtins__",
        "get_ipython",
        "breakpoint",
        "redirect_stdout",
        "redirect_stderr",  # would hide the checker's FAIL line
    }
)
# Modules an answer never needs: the checks themselves, and ways to rebind or import by name.
FORBIDDEN_MODULES = (
    "course_lib.checks", "course_grader", "course_lib.checks.verdict",
    "importlib", "builtins", "IPython", "ipykernel",
)  # fmt: skip
# The only parts of course_lib an answer may import from (chunk_bounds, the error types).
LIBRARY_ALLOWED = ("course_lib.comm",)
# Attributes that lead from an object to a namespace (a module's, a frame's, a function's).
_FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "__dict__",
        "__globals__",
        "__builtins__",
        "__code__",
        "__closure__",
        "__class__",
        "__bases__",
        "__mro__",
        "__subclasses__",
        "__setattr__",
        "__delattr__",
        "__getattribute__",
        "__import__",
        "__loader__",
        "__spec__",
        "__self__",
        "__func__",
        "__wrapped__",
        "__defaults__",
        "__kwdefaults__",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_back",
        "tb_frame",
        "gi_frame",
        "cr_frame",
        "_getframe",
        "get_ipython",
        "redirect_stdout",
        "redirect_stderr",
    }
)
# Names every check cell relies on, whatever the assignment.
_ALWAYS_PROTECTED = frozenset({"print", "verdict", "Verdict"})


# CPython 3.11 before 3.11.8 keeps the AST constructor's recursion depth in one place per
# interpreter: two threads parsing at once (the gradebook grades students in a thread pool)
# raise ``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905).
_AST_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse``, one thread at a time (safe in the gradebook's thread pool)."""
    with _AST_LOCK:
        return ast.parse(source)


def _parse(source: str) -> ast.Module | None:
    """Parse a cell as the kernel would (magics become ``get_ipython()`` calls); None if invalid."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - without IPython, magics stay a SyntaxError below
        pass
    try:
        return parse_python(source)
    except SyntaxError:
        return None  # the kernel will not run it either: the check fails on its own


def _bound_names(tree: ast.AST) -> Iterable[tuple[str, int]]:
    """Yield (name, line) for every name the cell binds in the notebook's namespace.

    Names local to a function or class body are left out (they cannot shadow a check), except
    those declared ``global``.
    """

    def visit(node: ast.AST, top: bool) -> Iterable[tuple[str, int]]:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Global):
            yield from ((name, line) for name in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if top:
                yield node.name, line
            for child in ast.iter_child_nodes(node):
                yield from visit(child, False)
            return
        elif isinstance(node, ast.Lambda):
            yield from visit(node.body, False)
            return
        elif top and isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            yield node.id, line
        elif top and isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                yield (alias.asname or alias.name).split(".")[0], line
        elif top and isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name, line
        for child in ast.iter_child_nodes(node):
            yield from visit(child, top)

    yield from visit(tree, True)


def _imported_names(trees: Iterable[ast.AST]) -> set[str]:
    """Return the names that import statements bind (modules, and names taken from them)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _root(node: ast.AST) -> str | None:
    """Return the name at the root of ``a.b[c].d``, or None (also when a call is on the way)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _within(name: str, module: str) -> bool:
    """Return True when ``name`` is ``module`` or lies inside it (``torch.nn`` in ``torch``)."""
    return name == module or name.startswith(module + ".")


def _module_problem(module: str, forbidden: Iterable[str] = ()) -> str | None:
    """Say why importing ``module`` (a dotted name, ``pkg.mod.name`` for from-imports) is refused."""
    # A prefix, so that course_grader.assignments.a1.checks and course_lib.checks.lecture03 are caught alike.
    if any(module.startswith(banned) for banned in FORBIDDEN_MODULES):
        return f"imports {module}"
    # The kit's library holds the reference answers (course_lib.collectives.ring_allreduce,
    # course_lib.training.scratch.conv2d): only the communicator's helpers may be imported from it.
    if _within(module, "course_lib") and not any(_within(module, ok) for ok in LIBRARY_ALLOWED):
        allowed = ", ".join(f"from {ok} import ..." for ok in LIBRARY_ALLOWED)
        return (
            f"imports {module}: the kit's library holds the reference answers (allowed: {allowed})"
        )
    for banned in forbidden:
        if _within(module, banned):
            return f"imports {module}, which this assignment does not allow"
    return None


def protected_names(pristine: NotebookNode) -> frozenset[str]:
    """Return the names an answer cell of ``pristine`` must not rebind.

    They are ``print``, ``verdict``, ``Verdict``, every ``check_*`` name, and every name the
    check cells use that no answer defines (such as the ``cluster`` the A2 checks run on); the
    functions the answers define (``sgd_momentum``) are, of course, the answers' to define.
    """
    answered, used = set(), set()
    for cell in pristine.cells:
        if cell.get("cell_type") != "code":
            continue
        tree = _parse(cell.source)
        if tree is None:
            continue
        if answer_id(cell) is not None:
            answered.update(name for name, _ in _bound_names(tree))
        elif check_id(cell) is not None:
            used.update(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    return frozenset((used - answered) | _ALWAYS_PROTECTED)


def answer_problem(
    source: str,
    protected: Iterable[str] = _ALWAYS_PROTECTED,
    modules: Iterable[str] = (),
    forbidden_imports: Iterable[str] = (),
) -> str | None:
    """Return what in an answer cell could forge a verdict ("line 2 rebinds print"), or None.

    Args:
        source: the answer cell's code.
        protected: names the check cells rely on (see :func:`protected_names`).
        modules: names the notebook's other cells bind by import (``np``, ``torch``): an answer
            may use them, but not assign to their attributes.
        forbidden_imports: modules this assignment's answers may not import (its notebook's
            ``metadata.course.forbidden_imports``, e.g. ``torch`` for "NumPy only").
    """
    forbidden_imports = tuple(forbidden_imports)
    tree = _parse(source)
    if tree is None:
        return None
    protected = set(protected)
    for name, line in _bound_names(tree):
        if name in protected or name.startswith("check_"):
            return f"line {line} rebinds {name}, which the check cells use"
    imported = _imported_names([tree]) | set(modules)
    sys_names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "sys"
    }
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import course_lib.comm` binds course_lib itself, and with it the whole library
                name = alias.name if alias.asname else alias.name.split(".")[0]
                if problem := _module_problem(alias.name, forbidden_imports) or (
                    _module_problem(name, forbidden_imports)
                ):
                    return f"line {line} {problem}"
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    return f"line {line} imports * from {module}; import the names you use"
                if module == "sys" and alias.name in ("modules", "_getframe"):
                    return f"line {line} imports sys.{alias.name}"
                # the module for the checks' own packages; the full name for the library
                # rule, so that `from course_lib.comm import chunk_bounds` passes
                if problem := _module_problem(f"{module}.{alias.name}", forbidden_imports):
                    return f"line {line} {problem}"
                if any(module.startswith(banned) for banned in FORBIDDEN_MODULES):
                    return f"line {line} imports {module}"
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            magic = " (IPython magics and ! commands call it)" if node.id == "get_ipython" else ""
            return f"line {line} uses {node.id}{magic}"
        elif isinstance(node, ast.Attribute):
            if node.attr in _FORBIDDEN_ATTRIBUTES:
                return f"line {line} uses the attribute {node.attr}"
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                # comm._builtin(...) and the like would bypass the counters the checks read
                return f"line {line} uses the private attribute {node.attr}; use the public API"
            if node.attr == "modules" and _root(node.value) in sys_names:
                return f"line {line} uses sys.modules"
            if isinstance(node.ctx, (ast.Store, ast.Del)) and _root(node) in imported:
                return f"line {line} changes {ast.unparse(node)}, which the checks rely on"
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, (ast.Store, ast.Del))
            and isinstance(node.value, ast.Attribute)
            and _root(node) in imported
        ):
            return f"line {line} changes {ast.unparse(node.value)}[...], which the checks rely on"
    return None


def rejected_answers(pristine: NotebookNode, answers: dict[str, str]) -> dict[str, str]:
    """Return {exercise: reason} for the answers (exercise -> code) that are not to be run."""
    protected = protected_names(pristine)
    modules: set[str] = set()  # what the notebook's own cells import: np, torch, F
    for cell in pristine.cells:
        if cell.get("cell_type") == "code" and answer_id(cell) is None:
            tree = _parse(cell.source)
            modules |= _imported_names([tree]) if tree is not None else set()
    forbidden = pristine.metadata.get("course", {}).get("forbidden_imports", [])
    rejected = {}
    for exercise, code in answers.items():
        try:
            problem = answer_problem(code, protected, modules, forbidden)
        except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - the student's code
            # ast.parse recurses (a sum of 100 000 terms: RecursionError; a long chain of "-":
            # MemoryError): an answer the guard cannot read is not run, and costs only its exercise
            rejected[exercise] = _(
                "the grader could not judge this answer: its cell could not be read "
                "({error}); split long expressions"
            ).format(error=f"{type(exc).__name__}: {str(exc)[:120]}")
            continue
        if problem is not None:
            rejected[exercise] = _(
                "not graded: the answer cell {problem}; an answer may define its own functions "
                "and variables and import libraries, but not touch the checks (change it and "
                "run the check cell again)"
            ).format(problem=problem)
    return rejected
