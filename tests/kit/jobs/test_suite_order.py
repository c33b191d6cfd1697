"""The test command hands out the longest files first (issue 34: the room's lectures were the long pole)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from conftest import LONGEST_FIRST, longest_first

from course_kit.jobs.suite import PYTEST_ARGS

ROOT = Path(__file__).resolve().parents[3]


def test_the_longest_files_come_first_and_each_file_keeps_its_order():
    items = [SimpleNamespace(nodeid=n) for n in (
        "tests/a.py::t1", f"{LONGEST_FIRST[1]}::x", "tests/a.py::t2",
        f"{LONGEST_FIRST[0]}::y[1]", f"{LONGEST_FIRST[0]}::y[2]", "notebooks/00.ipynb::Cell 0",
    )]  # fmt: skip
    assert [i.nodeid for i in longest_first(items)] == [
        f"{LONGEST_FIRST[0]}::y[1]", f"{LONGEST_FIRST[0]}::y[2]", f"{LONGEST_FIRST[1]}::x",
        "tests/a.py::t1", "tests/a.py::t2", "notebooks/00.ipynb::Cell 0",
    ]  # fmt: skip


def test_every_file_named_exists_and_xdist_keeps_the_order():
    assert [name for name in LONGEST_FIRST if not (ROOT / name).is_file()] == []
    # without it, xdist sorts the files by their number of tests, whatever the collection order
    assert "--no-loadscope-reorder" in PYTEST_ARGS and "loadfile" in PYTEST_ARGS
