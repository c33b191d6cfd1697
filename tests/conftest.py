"""Shared test set-up: every test session gets its own IPython directory, so the clusters the
tests and notebooks start never touch (or collide with) the user's own profiles."""

from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Point IPYTHONDIR at a fresh folder before any engine or notebook kernel starts."""
    if "COURSE_KEEP_IPYTHONDIR" not in os.environ:
        os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="course-ipython-")
    # Functions defined in a test module are shipped to engines by reference to that module,
    # so the engines (started with this process's environment) must be able to import it.
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (tests_dir, os.environ.get("PYTHONPATH", "")) if p
    )
    # Notebooks and tests pick their own cluster; a developer's lab settings must not leak in.
    for name in ("COURSE_CLUSTER_KIND", "COURSE_CLUSTER_PROFILE", "COURSE_CLUSTER_FILE"):
        os.environ.pop(name, None)
