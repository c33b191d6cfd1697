"""The grader checks itself before grading: a broken grading machine is blamed in one line.

Also the case that used to give every student 0 with ``ModuleNotFoundError``: a checkout whose
``.venv`` is a link to another checkout's environment, whose editable install of ``course_lib``
points to that other checkout (which the sandbox does not show).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.grading.gradebook import load_sources
from course_lib.grading.sandbox import SandboxLimits, kit_package, sandbox_problem
from course_lib.grading.selfcheck import GradingMachineError, preflight

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "assignments" / "source"
_PROBLEM = sandbox_problem()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _PROBLEM is not None and ("unshare" in _PROBLEM or not sys.platform.startswith("linux")),
        reason=str(_PROBLEM),
    ),
]


def test_preflight_passes_on_a_working_machine():
    assert preflight(load_sources(SOURCES), SandboxLimits()) > 0


def test_a_kit_the_sandbox_cannot_import_stops_grading_with_one_line():
    hidden = SandboxLimits(hidden=(str(kit_package()),))  # the kernel finds no course_lib
    with pytest.raises(GradingMachineError) as caught:
        preflight(load_sources(SOURCES), hidden)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("grading machine:"), message
    assert "course_lib" in message and "the sandbox shows the kit at" in message, message


def test_a_checkout_whose_venv_links_to_another_checkouts_environment_grades(tmp_path):
    # A second checkout: its own kit and sources, .venv a link to this environment, whose
    # editable install (if any) points elsewhere. `./kit grade` runs `.venv/bin/python -m ...`
    # from the checkout, without PYTHONPATH.
    checkout = tmp_path / "checkout"
    shutil.copytree(
        kit_package(), checkout / "course_lib", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(SOURCES, checkout / "assignments" / "source")
    (checkout / ".venv").symlink_to(Path(sys.prefix).resolve())
    (tmp_path / "submissions").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [
            str(checkout / ".venv" / "bin" / "python"),
            "-m",
            "course_lib.grading",
            "grade",
            str(tmp_path / "submissions"),
            "--out",
            str(tmp_path / "grades"),
        ],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the grading machine checked itself" in done.stdout
