"""``./kit slides``: every lecture's deck builds from its stored outputs, a slide per slide-tagged cell."""

from __future__ import annotations

import json
from pathlib import Path

from course_kit.jobs.slides import slide_type, slides_job

ROOT = Path(__file__).resolve().parents[3]


def test_every_deck_builds(tmp_path: Path, capsys):
    assert slides_job(["all", "--out", str(tmp_path)]) == 0
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(capsys.readouterr().out.splitlines()) == len(notebooks)
    for nb in notebooks:
        html = (tmp_path / f"{nb.stem}.slides.html").read_text()
        cells = json.loads(nb.read_text())["cells"]
        starts = sum(slide_type(c) == "slide" for c in cells)
        assert "reveal" in html and starts >= 3, nb.name
        assert html.count("<section") >= starts, nb.name


def test_slide_types_come_from_the_tags_or_the_headings():
    assert (
        slide_type({"cell_type": "markdown", "source": "x", "metadata": {"tags": ["slide-title"]}})
        == "slide"
    )
    assert (
        slide_type({"cell_type": "code", "source": "x", "metadata": {"tags": ["slide-figure"]}})
        == "fragment"
    )
    assert slide_type({"cell_type": "markdown", "source": "## A", "metadata": {}}) == "slide"
    assert slide_type({"cell_type": "markdown", "source": "text", "metadata": {}}) == "-"


def test_one_lecture_by_number(tmp_path: Path):
    assert slides_job(["3", "--out", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["03_communication.slides.html"]
    assert slides_job(["77", "--out", str(tmp_path)]) == 2


def test_an_offline_deck_loads_reveal_from_beside_it(tmp_path: Path):
    assert slides_job(["3", "--out", str(tmp_path), "--offline"]) == 0
    html = (tmp_path / "03_communication.slides.html").read_text()
    for needed in ("reveal.js/dist/reveal.js", "reveal.js/plugin/notes/notes.js", "require.js"):
        assert f'"reveal_offline/{needed}"' in html, needed
        assert (tmp_path / "reveal_offline" / needed).is_file(), needed
    assert (
        "unpkg.com/reveal.js" not in html and "cdnjs.cloudflare.com/ajax/libs/require" not in html
    )
    assert "if(window.MathJax && MathJax.Hub.getAllJax(" in html  # no error when MathJax is absent
