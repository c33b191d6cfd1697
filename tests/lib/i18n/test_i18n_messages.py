"""The kit's messages in the notebook's language: English by default and unchanged, Russian under ``COURSE_LANG=ru`` or in a notebook of ``notebooks/ru/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_lib.checks.verdict import Verdict, run_check
from course_lib.cluster.recovery import RecoveryReport
from course_lib.i18n import _, language

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def no_language(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("COURSE_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)


def test_english_is_the_default_and_byte_identical() -> None:
    assert language() == "en"
    assert (
        str(Verdict("A1.2", "sgd", True, "ok", 2, 2, True))
        == "Exercise A1.2 sgd: PASS (ok) [2/2 points]"
    )
    assert str(Verdict("0.1", "f", False, "x")) == "Exercise 0.1 f: FAIL (x)"
    report = RecoveryReport([1, 2], "restarted", 9.84, True)
    assert str(report) == (
        "hung ranks: 1, 2; restarted in 9.8 s (engines are new: variables defined on them "
        "earlier are gone, re-run setup)"
    )


def test_course_lang_ru_speaks_russian(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    monkeypatch.setenv("COURSE_LANG", "ru_RU.UTF-8")
    assert language() == "ru"

    def stub() -> str:
        raise NotImplementedError("Exercise 0.1: …")

    run_check("0.1", "f", stub, max_points=2)
    assert (
        capsys.readouterr().out
        == "Упражнение 0.1 f: НЕ ЗАЧТЕНО (ещё не реализовано: Exercise 0.1: …) [баллы: 0/2]\n"
    )
    assert str(RecoveryReport([0], "interrupted", 0.1)) == "зависшие ранги: 0; прерваны за 0.1 с"


def test_a_notebook_in_notebooks_ru_speaks_russian(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel (nbval, nbconvert, JupyterLab) runs in the notebook's folder; JupyterLab also names it."""
    monkeypatch.chdir(ROOT / "notebooks" / "ru")
    assert language() == "ru" and _("PASS") == "ЗАЧТЕНО"
    monkeypatch.chdir(ROOT / "notebooks")
    assert language() == "en" and _("PASS") == "PASS"
    monkeypatch.setenv("JPY_SESSION_NAME", str(ROOT / "notebooks" / "ru" / "00_cluster.ipynb"))
    assert language() == "ru"


def test_a_language_without_a_catalogue_is_english(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COURSE_LANG", "de")
    assert _("wrong answer") == "wrong answer"
