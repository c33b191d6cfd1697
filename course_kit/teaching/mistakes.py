"""No lecture (the lecturer's documents). The mistakes the lecture checks name, read from their code (no import runs).

A mistake is what a check says when an answer is wrong: the message of every ``assert ..., MSG``
and ``raise AssertionError(MSG)`` in the library's lecture checks (``checks/lectureNN*.py``), the strings returned by
the checks' ``-> str | None`` helpers (a ``None`` means "no problem"), and each library function a
check refuses to let an answer call (``REFUSED``: "calling X: Y"). An f-string's fields are kept
as ``{name}``. The exercise is the ``N.M`` that the enclosing function's code names, so a module
serving two lectures (``lecture01_02``) splits by exercise.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHECKS", "Mistake", "mistakes_of_lecture"]

CHECKS = Path(__file__).resolve().parents[2] / "course_lib" / "checks"
_EXERCISE = re.compile(r"^(\d+)\.(\d+)$")


@dataclass(frozen=True, order=True)
class Mistake:
    """One mistake a check names: its exercise (``"3.1"``, or ``""`` when no exercise is named) and text."""

    exercise: str
    text: str
    refused: str = ""  # for a refused library call: the function, and ``hint`` what to write
    hint: str = ""


def _render(node: ast.AST, consts: dict[str, str] | None = None) -> str | None:
    """Return the text of a string or f-string literal (fields as ``{expr}``), else None.

    A field naming a module-level string constant (``consts``) is replaced by its value.
    """
    consts = consts or {}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in consts:  # a module constant used as a message
        return consts[node.id]
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                name = ast.unparse(part.value)
                out.append(consts.get(name, "{" + name + "}"))
        return "".join(out)
    if isinstance(node, ast.Call):  # ``_("…")`` and ``_("… {n} …").format(n=…)``: the template
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "format":
            return _render(func.value, consts)
        if isinstance(func, ast.Name) and func.id in ("_", "N_") and node.args:
            return _render(node.args[0], consts)
    if isinstance(node, ast.IfExp):  # ``None if ok else "..."``: the literal branch
        return _render(node.orelse, consts) or _render(node.body, consts)
    if isinstance(node, ast.BoolOp):  # ``error or f"..."``: the literal operands
        texts = [t for v in node.values if (t := _render(v, consts))]
        return texts[-1] if texts else None
    return None


def _exercise(function: ast.AST) -> str:
    """Return the first ``N.M`` string the function's code names (``REFUSED["3.1"]``, ``run_check("3.1", ...)``)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _EXERCISE.match(node.value):
                return node.value
    return ""


def _returns_problem(function: ast.FunctionDef) -> bool:
    return function.returns is not None and ast.unparse(function.returns) in (
        "str | None",
        "Optional[str]",
    )


def _messages(function: ast.AST, consts: dict[str, str]) -> list[str]:
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assert) and node.msg is not None:
            found.append(_render(node.msg, consts))
        elif (
            isinstance(node, ast.Raise)
            and isinstance(node.exc, ast.Call)
            and ast.unparse(node.exc.func) == "AssertionError"
            and node.exc.args
        ):
            found.append(_render(node.exc.args[0], consts))
    if isinstance(function, ast.FunctionDef) and _returns_problem(function):
        found += [
            _render(n.value, consts)
            for n in ast.walk(function)
            if isinstance(n, ast.Return) and n.value
        ]
    return [text for text in found if text]


def _refusal(exercise: str, name: str | None, hint: str | None) -> Mistake:
    """Return the mistake of a ``REFUSED`` entry: calling ``name`` (its text, and its parts)."""
    return Mistake(exercise, f"calling {name}: {hint}", str(name), str(hint))


def _refused(tree: ast.Module, consts: dict[str, str]) -> list[Mistake]:
    """Return the ``REFUSED`` table's entries: per exercise, or for the whole module."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "REFUSED" for t in node.targets
        ):
            table = node.value
            if not isinstance(table, ast.Dict):
                continue
            for key, value in zip(table.keys, table.values, strict=True):
                name = _render(key, consts) if key is not None else None
                if isinstance(value, ast.Dict) and name and _EXERCISE.match(name):
                    for k2, v2 in zip(value.keys, value.values, strict=True):
                        out.append(_refusal(name, _render(k2, consts), _render(v2, consts)))
                elif name:
                    out.append(_refusal("", name, _render(value, consts)))
    return out


def _literal(node: ast.AST) -> str | None:
    """Return a module constant's string: ``"..."`` or ``N_("...")`` (marked for the catalogue)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "N_" and node.args:
        node = node.args[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def module_mistakes(path: Path) -> list[Mistake]:
    """Return every mistake one check module names, sorted and without repeats."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    consts = {
        t.id: text
        for node in tree.body
        if isinstance(node, ast.Assign) and (text := _literal(node.value)) is not None
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    found = set(_refused(tree, consts))
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    for node in defs:
        exercise = _exercise(node) or _caller_exercise(node.name, defs)
        found.update(Mistake(exercise, text) for text in _messages(node, consts))
    return sorted(found)


def _caller_exercise(name: str, defs: list[ast.AST], depth: int = 3) -> str:
    """Return the exercise of the first function that uses ``name`` (a helper of a check)."""
    if depth == 0:
        return ""
    for node in defs:
        uses = any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))
        if uses and getattr(node, "name", None) != name:
            found = _exercise(node) or _caller_exercise(node.name, defs, depth - 1)
            if found:
                return found
    return ""


def _modules_for(lecture: int, folder: Path) -> list[Path]:
    out = []
    for path in sorted(folder.glob("lecture*.py")):
        numbers = [int(n) for n in re.findall(r"\d+", path.stem)]
        if lecture in numbers:
            out.append(path)
    return out


def mistakes_of_lecture(lecture: int, folder: Path = CHECKS) -> list[Mistake]:
    """Return the mistakes lecture ``lecture``'s checks name (a shared module: its exercises only)."""
    out = []
    for path in _modules_for(lecture, folder):
        shared = len(re.findall(r"\d+", path.stem)) > 1
        for m in module_mistakes(path):
            if not shared or not m.exercise or m.exercise.split(".")[0] == str(lecture):
                out.append(m)
    return out
