"""No lecture (the grader). The kit as an assignment's kernel sees it: the functions the assignment asks for cut out.

A2-A7 show their kernels the kit (``course_lib``): the engines need the communicators, the
data-parallel seam, the training loop. But the kit also holds the reference answers (A3.2's
``bucket_layout`` is the kit's own, reached through ``pkgutil.resolve_name``; issue 35). Each
assignment names what it asks for (``ProbeSpec.kit_cut``, ``"module:function"`` or
``"module:Class.method"``); for each module named, the grader writes a copy whose named
definitions keep their signatures but whose bodies only raise, and the sandbox binds that copy
over the module (read-only), with the module's compiled copies (``__pycache__``) hidden. The
rest of the kit is the kit: the module still imports, and every other name in it works.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from course_grader.verdict.guard import parse_python

__all__ = ["CUT_MESSAGE", "cut_overlays", "cut_source"]

#: What a cut function raises (the kernel sees it in place of the reference's code).
CUT_MESSAGE = (
    "{ref} is cut from the kit this assignment's kernel sees: the exercise asks you to write it"
)


def _targets(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The definition ``qualname`` ("f" or "Class.method") at the module's top level."""
    body: list[ast.stmt] = tree.body
    *outer, name = qualname.split(".")
    for part in outer:
        found = [n for n in body if isinstance(n, ast.ClassDef) and n.name == part]
        if not found:
            return None
        body = found[-1].body
    found = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name == name]  # fmt: skip
    return found[-1] if found else None


def cut_source(source: str, qualnames: list[str], module: str) -> str:
    """Return ``source`` with each definition in ``qualnames`` reduced to ``raise RuntimeError``.

    The ``def`` line (and decorators, signature) stay, so the module imports and its other code
    that names the function still loads; the body is one line. Raise ``LookupError`` when a name
    is not defined there (the kit renamed it: update the assignment's ``kit_cut``).
    """
    tree = parse_python(
        source
    )  # the kit's own source, parsed one thread at a time as the grader does
    lines = source.splitlines(keepends=True)
    spans = []
    for qualname in qualnames:
        node = _targets(tree, qualname)
        if node is None:
            raise LookupError(f"{module} defines no {qualname}: update the assignment's kit_cut")
        first = node.body[0]
        if first.lineno == node.lineno:
            raise LookupError(f"{module}:{qualname} is defined on one line: cannot cut its body")
        indent = " " * first.col_offset
        message = CUT_MESSAGE.format(ref=f"{module}:{qualname}")
        spans.append((first.lineno, node.end_lineno, f"{indent}raise RuntimeError({message!r})\n"))
    for start, end, stub in sorted(spans, reverse=True):  # bottom up: line numbers stay valid
        lines[start - 1 : end] = [stub]
    return "".join(lines)


def cut_overlays(
    cut: tuple[str, ...], folder: Path, checkout: Path
) -> tuple[list[list[str]], list[str]]:
    """Write under ``folder`` the cut copies of the modules ``cut`` names (in ``checkout``'s kit).

    Return the overlays ([kit file, its cut copy], for the sandbox to bind over the kit's) and the
    compiled-copy folders to hide (a ``.pyc`` holds the reference's code as well).
    """
    by_module: dict[str, list[str]] = defaultdict(list)
    for ref in cut:
        module, _, qualname = ref.partition(":")
        if not qualname:
            raise ValueError(f"kit_cut entry {ref!r}: write it as 'module:function'")
        by_module[module].append(qualname)
    folder.mkdir(parents=True, exist_ok=True)
    overlays, caches = [], []
    for module, qualnames in sorted(by_module.items()):
        # found by its path, not imported: the grader need not load torch to cut the kit
        original = Path(checkout).joinpath(*module.split(".")).with_suffix(".py")
        if not module.startswith("course_lib.") or not original.is_file():
            raise LookupError(f"kit_cut names {module}, which is no module of course_lib")
        copy = folder / f"{module}.py"
        copy.write_text(cut_source(original.read_text(), qualnames, module))
        overlays.append([str(original), str(copy)])
        cache = original.parent / "__pycache__"
        cache.mkdir(exist_ok=True)  # hidden only if it exists when the sandbox is built
        if str(cache) not in caches:
            caches.append(str(cache))
    return overlays, caches
