"""nbformat without the IRI grammar (course_grader.lean_nbformat): never built, validation unchanged."""

from __future__ import annotations

import subprocess
import sys

from course_grader.runner import NBVAL_PLUGINS

# In a fresh process (this one imported nbformat long ago), the plugins imported as nbval's
# process loads them (course_grader.runner), then nbformat's validation on good and bad input.
SCRIPT = """
import importlib, sys
for plugin in sys.argv[1:]:
    importlib.import_module(plugin)
import nbformat
from nbformat.validator import ValidationError

assert "lark" not in sys.modules, "the IRI grammar was built"
good = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
nbformat.validate(good)
for bad in (
    dict(good, cells=[dict(good.cells[0], cell_type="kode")]),
    dict(good, cells=[dict(good.cells[0], outputs="none")]),
    {k: v for k, v in good.items() if k != "metadata"},
):
    try:
        nbformat.validate(nbformat.from_dict(bad))
    except ValidationError:
        continue
    raise SystemExit(f"a malformed notebook passed: {bad}")
print("ok")
"""


def test_nbvals_process_never_builds_the_iri_grammar_and_still_refuses_a_malformed_notebook():
    done = subprocess.run([sys.executable, "-c", SCRIPT, *NBVAL_PLUGINS],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
