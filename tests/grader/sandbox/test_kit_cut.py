"""The kit an assignment's kernel sees: the functions the assignment asks for cut out (issue 35).

The unit tests cut a made-up module; the sandbox tests build each engine assignment's sandbox as
the grader does (its hidden parts, its cut) and try, from inside, to reach every reference the
assignment cuts through ``pkgutil.resolve_name``: each resolves only to a stub that raises, its
compiled copy is hidden, and the module it lives in still imports. That the source notebooks still
get full marks in this view is shown by their end-to-end grading tests
(``tests/grader/assignments/test_grading_a*.py``), which grade through the same sandbox.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_grader.registry import assignments
from course_grader.sandbox.config import (
    KERNEL_NAME,
    SandboxLimits,
    kit_package,
    prepare_sandbox,
    sandbox_problem,
)
from course_grader.sandbox.kit_cut import CUT_MESSAGE, cut_overlays, cut_source

MODULE = '''
import functools


def kept(x):
    return x + 1


@functools.lru_cache(maxsize=None)
def reference(x, y=2):
    """The answer."""
    total = x * y
    return total


class Thing:
    def method(self, x):
        secret = x * 3
        return secret

    def other(self):
        return kept(1)
'''


def test_a_cut_function_keeps_its_signature_and_only_raises():
    cut = cut_source(MODULE, ["reference", "Thing.method"], "made.up")
    assert "total = x * y" not in cut and "secret = x * 3" not in cut
    names: dict = {}
    exec(compile(cut, "made_up.py", "exec"), names)  # noqa: S102 - the test's own text
    assert names["kept"](1) == 2 and names["Thing"]().other() == 2
    for call in (lambda: names["reference"](1), lambda: names["Thing"]().method(1)):
        with pytest.raises(RuntimeError, match="is cut from the kit this assignment's kernel sees"):
            call()


def test_a_name_the_module_does_not_define_is_refused():
    with pytest.raises(LookupError, match="made.up defines no missing: update"):
        cut_source(MODULE, ["missing"], "made.up")
    with pytest.raises(ValueError, match="write it as 'module:function'"):
        cut_overlays(("course_lib.collectives.tree",), Path("/nonexistent"), Path("/nonexistent"))


REACH = """
import importlib, inspect, json, os, pkgutil, sys
found = {}
for ref in sys.argv[1:]:
    module, _, name = ref.partition(":")
    importlib.import_module(module)  # the module itself still imports
    fn = pkgutil.resolve_name(ref)
    fn = getattr(fn, "__wrapped__", fn)
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    try:
        fn(*[None] * len(params))
        raised = "nothing"
    except RuntimeError as exc:
        raised = str(exc)
    except Exception as exc:
        raised = type(exc).__name__
    cache = os.path.join(os.path.dirname(inspect.getfile(fn)), "__pycache__")
    found[ref] = {"raised": raised, "source": inspect.getsource(fn),
                  "cached": os.listdir(cache) if os.path.isdir(cache) else []}
print(json.dumps(found))
"""
ENGINE_ASSIGNMENTS = ["A2", "A3", "A4", "A5", "A6", "A7"]


@pytest.mark.skipif(sandbox_problem() is not None, reason=str(sandbox_problem()))
@pytest.mark.parametrize("assignment", ENGINE_ASSIGNMENTS)
def test_the_kits_reference_answers_cannot_be_reached_from_the_sandbox(tmp_path, assignment):
    import importlib.util
    import inspect
    import pkgutil
    import py_compile

    spec = assignments()[assignment]()
    assert spec.kit and spec.kit_cut, f"{assignment} shows its kernel the whole kit"
    hidden = tuple(str(kit_package().parent / part) for part in spec.kit_hidden)
    for ref in spec.kit_cut:  # a compiled copy of each module, as a grader's imports leave them
        source = inspect.getsourcefile(pkgutil.resolve_name(ref.partition(":")[0]))
        compiled = importlib.util.cache_from_source(source)
        # Written only where missing (tests/conftest.py compiles the kit first): rewriting a .pyc
        # of the kit while the other worker grades unisolated reads there as the graded notebook
        # changing the kit (a fresh clone's run blamed the poisoner test's blank notebook for it).
        if not Path(compiled).is_file():
            py_compile.compile(source, cfile=compiled, doraise=True)
    env = prepare_sandbox(tmp_path / "run", SandboxLimits(), hidden, kit=True, cut=spec.kit_cut)
    kernel = json.loads(
        Path(env["JUPYTER_PATH"], "kernels", KERNEL_NAME, "kernel.json").read_text()
    )
    wrapper = kernel["argv"][: kernel["argv"].index("--") + 1]
    done = subprocess.run([*wrapper, sys.executable, "-c", REACH, *spec.kit_cut],
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    for ref in spec.kit_cut:
        inside = found[ref]
        assert inside["raised"] == CUT_MESSAGE.format(ref=ref), (ref, inside["raised"])
        original = inspect.getsource(pkgutil.resolve_name(ref))  # the grader's own copy
        assert inside["source"] != original and CUT_MESSAGE[:20] not in original, ref
        assert inside["cached"] == [], (ref, inside["cached"])  # no .pyc of the reference
