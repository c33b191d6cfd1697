"""The functions a lecture notebook ships (its exercise stubs), for the tests of its checks.

A test takes the stub from the notebook itself, so it proves what a student receives fails the
check, and that the lecture ships a stub at all (a solved exercise would pass and fail the test).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

__all__ = ["notebook_function"]


def notebook_function(notebook: str, name: str) -> Callable:
    """Return the function ``name`` as the code cell of ``notebooks/<notebook>`` defines it.

    The cell's definition is executed alone (in a fresh namespace named like the notebook's
    ``__main__``, so engines receive it by value, as they do from a notebook).
    """
    cells = json.loads((NOTEBOOKS / notebook).read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if f"def {name}(" not in source:
            continue
        tree = ast.parse(source)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                namespace: dict = {"__name__": "__main__"}
                code = compile(ast.Module([node], []), f"<{notebook}>", "exec")
                exec(code, namespace)  # noqa: S102 - the course's own notebook
                return namespace[name]
    raise LookupError(f"{notebook} defines no function {name}")
