"""The integrity guard unisolated: an answer that poisons the kit is blamed, the kit restored.

This module changes the kit's own files while it runs, so it holds the kit exclusively
(``CHANGES_THE_KIT``; see ``tests/conftest.py``): no other grading module, whose guard watches
the same files, runs meanwhile on the other worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from course_grader.grade import GradingLimits
from course_grader.gradebook import grade_folder
from course_grader.sandbox.config import grader_package, kit_package
from course_grader.selftest.attacks.sandbox import ATTACKS, poison_code

CHANGES_THE_KIT = True
ROOT = Path(__file__).resolve().parents[3]
SOURCES = ROOT / "assignments" / "source"

POISON = next(code for s, e, _, code, _ in ATTACKS if (s, e) == ("attacker_a", "A1.1"))


@pytest.mark.slow
def test_unisolated_the_guard_blames_the_poisoner_restores_the_kit_and_regrades(tmp_path, capsys):
    source = nbformat.read(SOURCES / "A1_sgd_conv.ipynb", as_version=4)
    released = nbformat.read(ROOT / "notebooks" / "assignments" / "A1_sgd_conv.ipynb", 4)
    pass_line = next(
        c.outputs[0]["text"].strip()
        for c in source.cells
        if c.metadata.get("course", {}).get("check") == "A1.1"
    )
    poisoner = nbformat.from_dict(json.loads(nbformat.writes(released)))
    for cell in poisoner.cells:
        if cell.metadata.get("course", {}).get("answer") == "A1.1":
            cell.source = POISON.format(kit=str(kit_package()), poison=poison_code(pass_line))
    for student, nb in (("a_poisoner", poisoner), ("b_blank", released)):
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "subs" / student / "A1_sgd_conv.ipynb")
    checks = grader_package() / "assignments" / "a1" / "checks.py"
    before = checks.read_bytes()
    try:
        rows = grade_folder(
            tmp_path / "subs", SOURCES, GradingLimits(60, 400), jobs=2, progress=False, sandbox=None
        )
    finally:
        if checks.read_bytes() != before:  # never leave the kit poisoned, even on failure
            checks.write_bytes(before)
            pytest.fail("the guard did not restore assignments/a1/checks.py")
    by = {(r.student, r.exercise): r for r in rows}
    assert all(by[("b_blank", ex)].points == 0 for ex in ("A1.1", "A1.2", "A1.3"))
    for ex in ("A1.1", "A1.2", "A1.3"):
        assert by[("a_poisoner", ex)].points == 0
        assert by[("a_poisoner", ex)].reason.startswith(
            "changed the grading environment (grader: changed assignments/a1/checks.py"
        )
    assert "a_poisoner changed the grading environment" in capsys.readouterr().err
