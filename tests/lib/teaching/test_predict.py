"""The prediction box: locked in JupyterLab until a prediction, open (and saying so) in tests; how far off is recorded."""

from __future__ import annotations

import json

import pytest

from course_lib.teaching.predict import RECORD_FILE, Prediction, interactive, off_by


def test_without_a_prediction_a_non_interactive_run_reveals_and_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert not interactive()
    p = Prediction("3.a", "ring time?", unit="ms", formula="2(N-1)(a + n/N b)", folder=tmp_path)
    text = p.reveal(101.0, 100.26)
    assert "measured 101 ms" in text and "= 100.3 ms" in text and "non-interactive" in text
    assert not (tmp_path / RECORD_FILE).exists()


def test_in_jupyterlab_the_measurement_stays_locked_until_a_prediction(tmp_path, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "lecture.ipynb")
    assert interactive()
    p = Prediction("3.a", "ring time?", unit="ms", folder=tmp_path)
    assert "locked" in p.reveal(101.0) and "101" not in p.reveal(101.0)
    text = p.submit(50)
    assert "measured 101 ms" in text and "too low by a factor 2" in text
    record = json.loads((tmp_path / RECORD_FILE).read_text())["3.a"]
    assert record["predicted"] == 50 and record["measured"] == 101.0
    monkeypatch.setenv("COURSE_NONINTERACTIVE", "1")
    assert not interactive()


def test_an_option_prediction_is_checked_against_its_options(tmp_path):
    p = Prediction("10.a", "which is faster?", options=("GPipe", "1F1B"), folder=tmp_path)
    with pytest.raises(ValueError, match="pick one of"):
        p.submit("ring")
    p.submit("GPipe")
    assert "you picked 'GPipe'" in p.reveal("1F1B")


def test_off_by_says_how_far():
    assert off_by(105, 100).startswith("within 10 %")
    assert off_by(300, 100).startswith("too high by a factor 3")
    assert off_by(-1, 100) == "wrong sign"
