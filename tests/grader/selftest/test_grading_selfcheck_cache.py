"""The self-check's cache and the self-test's engine routes, without a kernel (fast).

A remembered pass is keyed on what could change a graded run (the kit's files, the source, the
versions, the sandbox settings), and anything in the cache folder that is not a small regular
file holding that key is no cache. The engine routes of ``./kit grade --self-test`` must get
past the ``ast`` guard, or their 0 points would prove nothing about the grader.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat

from course_grader.cells import answer_id
from course_grader.sandbox.config import SandboxLimits, grader_package, kit_package
from course_grader.selftest.attacks.engines import A2_STEERING, ENGINE_ROUTES, write_engine_routes
from course_grader.selftest.selfcheck import kit_digest, remember, remembered, selfcheck_key
from course_grader.verdict.guard import rejected_answers

ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"


def test_the_key_changes_with_the_kit_the_source_and_the_sandbox(tmp_path):
    kit, grader = tmp_path / "course_lib", tmp_path / "course_grader"
    shutil.copytree(kit_package(), kit, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(grader_package(), grader, ignore=shutil.ignore_patterns("__pycache__"))
    source = nbformat.read(SOURCES / "A3_data_parallel.ipynb", as_version=4)
    limits, sha = SandboxLimits(), kit_digest(kit, grader)
    key = selfcheck_key(source, limits, sha)
    assert sha == kit_digest(kit_package()) and key == selfcheck_key(source, limits, sha)
    engine = grader / "assignments" / "a3" / "engine.py"
    engine.write_text(engine.read_text() + "\n# one more line\n")  # a changed grader file
    assert selfcheck_key(source, limits, kit_digest(kit, grader)) != key
    engine.unlink()  # a grader file gone
    assert kit_digest(kit, grader) not in (sha, kit_digest())
    before = kit_digest(kit, grader)
    (kit / "checks" / "verdict.py").unlink()  # a library file gone
    assert kit_digest(kit, grader) != before
    assert selfcheck_key(source, SandboxLimits(disk_mb=64), sha) != key
    source.cells.append(nbformat.v4.new_markdown_cell("One more hint."))
    assert selfcheck_key(source, limits, sha) != key


def test_anything_but_a_small_regular_entry_with_its_key_is_no_cache(tmp_path):
    cache, key = tmp_path / "cache", "ab" * 32
    assert not remembered(cache, key)  # no folder at all
    remember(cache, key, "A1", 5.0)
    assert remembered(cache, key)
    entry = cache / f"{key}.json"
    good = entry.read_text()
    for bad in (
        "{ not json",
        json.dumps({"key": "cd" * 32, "passed": True}),  # another key's entry copied here
        json.dumps({"key": key, "passed": "yes"}),
        json.dumps([key, True]),
        json.dumps({"key": key, "passed": True, "pad": "x" * 5000}),  # too big to be ours
    ):
        entry.write_text(bad)
        assert not remembered(cache, key), bad
    entry.unlink()
    (tmp_path / "elsewhere.json").write_text(good)
    entry.symlink_to(tmp_path / "elsewhere.json")  # a link, even to a good entry
    assert not remembered(cache, key)
    entry.unlink()
    entry.mkdir()
    assert not remembered(cache, key)
    os.rmdir(entry)
    (tmp_path / "file").write_text("")
    remember(tmp_path / "file" / "cache", key, "A1", 5.0)  # cannot be written: skipped, no error
    assert not list(cache.glob("*.partial"))  # course_lib.files' temporary files


def test_the_engine_routes_get_past_the_guard_with_a_wrong_answer(tmp_path):
    routes = write_engine_routes(tmp_path, SOURCES)
    assert sorted(r.assignment for r in routes.values()) == [
        "A2",
        "A2",
        "A3",
        "A4",
        "A5",
        "A6",
        "A7",
        "A9",
    ]
    assert len(ENGINE_ROUTES) == len(routes)
    for student, route in routes.items():
        source = nbformat.read(SOURCES / f"{route.notebook}.ipynb", as_version=4)
        written = nbformat.read(tmp_path / student / f"{route.notebook}.ipynb", as_version=4)
        answers = {answer_id(c): c.source for c in written.cells if answer_id(c)}
        correct = {answer_id(c): c.source for c in source.cells if answer_id(c)}
        assert not rejected_answers(source, answers), (route.assignment, route.what)
        assert answers[route.exercise] != correct[route.exercise]
        if route.prefix == A2_STEERING:  # a right answer, its output steered at the decoders
            assert answers[route.exercise].endswith(correct[route.exercise])
            continue
        assert "PASS" in answers[route.exercise] or "_forged" in answers[route.exercise]
