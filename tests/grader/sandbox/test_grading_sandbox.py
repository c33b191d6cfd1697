"""The grading sandbox and the integrity guard, against real attacks graded by the real grader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from course_grader import __main__ as cli
from course_grader.gradebook import write_gradebook
from course_grader.sandbox.config import (
    KERNEL_NAME,
    SandboxLimits,
    kit_package,
    prepare_sandbox,
    sandbox_problem,
)
from course_grader.selftest.attacks.sandbox import (
    outside_address,
)

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"
SITE = Path(sysconfig.get_paths()["purelib"])
# Skipped only where namespaces are missing (not Linux, or unshare refused): any other failure
# to start the sandbox is a defect, and fails the tests.
_PROBLEM = sandbox_problem()
needs_sandbox = pytest.mark.skipif(
    _PROBLEM is not None and ("unshare" in _PROBLEM or not sys.platform.startswith("linux")),
    reason=str(_PROBLEM),
)


@pytest.fixture(autouse=True)
def _sandbox_works():
    assert _PROBLEM is None or "unshare" in _PROBLEM or not sys.platform.startswith("linux"), (
        _PROBLEM
    )


PROBE = """
import json, os, pathlib, socket, sys
found = {"uid": os.getuid(), "pid": os.getpid()}
found["sources_seen"] = os.path.exists(sys.argv[1])
found["kit_seen"] = os.path.exists(sys.argv[2])
for name, path in (("kit", sys.argv[2] + "/zz.py"), ("venv", sys.argv[3] + "/zz.pth"),
                   ("tmp", "/tmp/zz")):
    try:
        open(path, "w").close()
        found[name + "_written"] = True
    except OSError:
        found[name + "_written"] = False
server = socket.create_server(("127.0.0.1", 0))
socket.create_connection(server.getsockname(), 5).close()
found["loopback"] = True
try:
    socket.create_connection((sys.argv[4], 9), 3)
    found["outside"] = "connected"
except OSError as exc:
    found["outside"] = type(exc).__name__
print(json.dumps(found))
"""


@needs_sandbox
def test_the_sandbox_hides_the_sources_refuses_writes_and_keeps_only_loopback(tmp_path):
    env = prepare_sandbox(tmp_path / "run", SandboxLimits(), (str(SOURCES),))
    spec = json.loads(Path(env["JUPYTER_PATH"], "kernels", KERNEL_NAME, "kernel.json").read_text())
    wrapper = spec["argv"][: spec["argv"].index("--") + 1]
    outside = outside_address() or "192.0.2.1"
    done = subprocess.run(
        [
            *wrapper,
            sys.executable,
            "-c",
            PROBE,
            str(SOURCES),
            str(kit_package()),
            str(SITE),
            outside,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["kit_seen"] and not found["sources_seen"]
    assert not found["kit_written"] and not found["venv_written"] and found["tmp_written"]
    assert found["loopback"] and found["outside"] != "connected"
    assert found["pid"] < 10  # a PID namespace of its own
    assert not (kit_package() / "zz.py").exists() and not (SITE / "zz.pth").exists()


REACH = """
import importlib, json, os, sys
found = {}
for folder in sys.argv[2:]:
    found[folder] = os.listdir(folder) if os.path.isdir(folder) else None
    sys.path.insert(0, folder)  # ahead of the venv's (blocked) copy
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
        found[name] = "imported"
    except ImportError as exc:
        found[name] = str(exc)[:80]
print(json.dumps(found))
"""


@needs_sandbox
def test_forbidden_packages_are_absent_whatever_their_copy(tmp_path):
    """scipy (forbidden in A1) from the base interpreter's site-packages, torch from the venv:
    neither imports, whatever folder is put on the path; every other interpreter's package
    folder is empty in the sandbox (issue 35)."""
    from course_grader.sandbox.config import foreign_site_packages

    foreign = foreign_site_packages()
    assert any("site-packages" in f or "dist-packages" in f for f in foreign), foreign
    env = prepare_sandbox(tmp_path / "run", SandboxLimits(), (), ("torch", "scipy"))
    spec = json.loads(Path(env["JUPYTER_PATH"], "kernels", KERNEL_NAME, "kernel.json").read_text())
    wrapper = spec["argv"][: spec["argv"].index("--") + 1]
    done = subprocess.run([*wrapper, sys.executable, "-c", REACH, "scipy,torch", *foreign],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["scipy"] != "imported" and found["torch"] != "imported", found
    assert all(found[folder] in ([], None) for folder in foreign), found


def test_require_sandbox_refuses_and_unisolated_grading_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "sandbox_problem", lambda: "no sandbox on plan9")
    (tmp_path / "subs").mkdir()
    args = ["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "grades")]
    assert cli.main([*args, "--require-sandbox"]) == 2
    assert "--require-sandbox refuses" in capsys.readouterr().err
    assert not (tmp_path / "grades").exists()
    assert cli.main(args) == 0
    assert "GRADED UNISOLATED (no sandbox on plan9)" in capsys.readouterr().err
    header = (tmp_path / "grades" / "gradebook.csv").read_text().splitlines()[0]
    assert header.startswith("# GRADED UNISOLATED (no sandbox on plan9)")
    write_gradebook([], tmp_path / "plain.csv")  # sandboxed: no warning line
    assert (tmp_path / "plain.csv").read_text().startswith("student,")


# The attack class itself (every attack in ATTACKS graded beside honest students) is graded once,
# with the routes past the guard, in tests/grader/selftest/test_grading_attacks.py.


def test_the_guard_compiles_what_it_watches_so_an_honest_import_writes_nothing(tmp_path):
    # A .pyc left stale by an edit to the kit (a git pull before grading) is rewritten by the first
    # notebook that imports the module: read as that notebook changing the kit, it cost an honest
    # student the grade, unless the guard compiles the kit before its fingerprint.
    import py_compile

    from course_grader.sandbox.integrity import EnvironmentGuard

    kit, grader, sources, site = (tmp_path / name for name in ("kit", "grader", "src", "site"))
    for folder in (kit / "sub", grader, sources, site):
        folder.mkdir(parents=True)
    for module in (kit / "a.py", kit / "sub" / "b.py", grader / "c.py"):
        module.write_text("VALUE = 1\n")
        py_compile.compile(str(module), doraise=True)
        module.write_text("VALUE = 2  # edited since it was compiled\n")
        os.utime(module, (module.stat().st_atime + 60, module.stat().st_mtime + 60))  # a minute on
    with EnvironmentGuard(kit, sources, site_packages=site, grader=grader) as guard:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        imported = subprocess.run([sys.executable, "-c", "import a, sub.b; print(a.VALUE)"],
                                  cwd=kit, env=env, capture_output=True, text=True, check=True)  # fmt: skip
        assert imported.stdout.strip() == "2"
        assert guard.changes() == []
