"""``./kit setup``: install the kit and its dependencies into this Python, and check them.

No lecture (the kit's plumbing). ``./kit`` creates ``.venv`` and installs into it itself
(bash: before this Python has anything), then runs ``setup --check``. Without bash (a Windows
PC), make the environment once with ``py -m venv .venv`` and
``.venv\\Scripts\\python -m pip install -e .[dev]``; afterwards ``python -m course_kit setup``
re-installs after ``pyproject.toml`` changed (a ``git pull``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata

from course_kit.jobs.handover import ROOT, KitParser, checkout_problem
from course_lib.i18n import _

__all__ = ["missing_requirements", "setup_job"]

DISTRIBUTION = "course-lib"
# What ./kit installs: the MPI wheel (mpich) exists for Linux and macOS only; its extra carries
# that marker, so the same extras are right everywhere (Windows PCs use MS-MPI instead).
EXTRAS = "mpi,dev"
SHOWN = ("torch", "ipyparallel", "mpi4py", "jupyterlab")


def missing_requirements(extras: tuple[str, ...] = ("dev",)) -> list[str]:
    """Return the kit's requirements (and those of ``extras``) not installed in this Python."""
    missing = []
    for requirement in metadata.requires(DISTRIBUTION) or []:
        name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)  # type: ignore[union-attr]
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if extra and extra.group(1) not in extras:
            continue
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def _check() -> int:
    try:
        missing = missing_requirements()
    except metadata.PackageNotFoundError:
        print(
            _(
                "kit setup: the kit ({distribution}) is not installed in {python}: "
                "run python -m course_kit setup from the checkout"
            ).format(distribution=DISTRIBUTION, python=sys.executable),
            file=sys.stderr,
        )
        return 1
    if missing:
        print(
            _(
                "kit setup: not installed in {python}: {missing}; run "
                "python -m course_kit setup (./kit setup) to install them"
            ).format(python=sys.executable, missing=", ".join(missing)),
            file=sys.stderr,
        )
        return 1
    versions = []
    for name in SHOWN:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue  # mpi4py may be left out where no MPI is installed
    print(
        _("kit: ready in {prefix}: Python {version}, {versions}").format(
            prefix=sys.prefix, version=sys.version.split()[0], versions=", ".join(versions)
        )
    )
    return 0


def setup_job(argv: list[str]) -> int:
    """Install the checkout with its extras into this Python (unless ``--check``); check it."""
    description = _(  # the docstring's first line
        "``./kit setup``: install the kit and its dependencies into this Python, and check them."
    )
    parser = KitParser(prog="./kit setup", description=description)
    parser.add_argument(
        "--check", action="store_true", help=_("only check that every dependency is installed")
    )
    args = parser.parse_args(argv)
    if not args.check:
        if (problem := checkout_problem("pyproject.toml")) is not None:
            print(f"kit setup: {problem}", file=sys.stderr)
            return 2
        print(
            _(
                "kit: installing the kit and its dependencies into {prefix} "
                "(torch is large: a few minutes)"
            ).format(prefix=sys.prefix),
            flush=True,
        )
        pip = [sys.executable, "-m", "pip", "install", "--quiet"]
        done = subprocess.run([*pip, "-e", f"{ROOT}[{EXTRAS}]"], check=False)
        if done.returncode != 0:
            print(
                _("kit setup: pip failed (exit {status}): see its message above").format(
                    status=done.returncode
                ),
                file=sys.stderr,
            )
            return 1
    return _check()
