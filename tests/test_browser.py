"""The kit as a student meets it: JupyterLab (started as ``./kit lab`` starts it) in a real browser.

Headless Chromium, driven by Playwright, opens lecture 0 and runs it through the Run menu, then
runs an assignment's first exercise cell by cell with Shift+Enter. Everything is read from the
page: execution counts, error outputs, the doctor's table, the progress widgets, the verdict line.
Skipped, with the reason, where Playwright or a Chromium executable is missing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import nbformat
import pytest
from browser_lab import (
    REPO,
    JupyterLabServer,
    NotebookPage,
    browser_skip_reason,
    open_browser,
    tracebacks,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(browser_skip_reason() is not None, reason=str(browser_skip_reason())),
    pytest.mark.xdist_group("browser"),
]

LECTURE = "00_cluster.ipynb"
ASSIGNMENT = "assignments/A1_sgd_conv.ipynb"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def lab():
    """One JupyterLab for the module; afterwards no kernel, engine or mpiexec of it is left."""
    stored = {name: _digest(REPO / "notebooks" / name) for name in (LECTURE, ASSIGNMENT)}
    server = JupyterLabServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
    assert not server.leftovers, f"processes outlived JupyterLab's shutdown: {server.leftovers}"
    for name, digest in stored.items():  # autosave is off: running must not rewrite the file
        assert _digest(REPO / "notebooks" / name) == digest, f"{name} was modified on disk"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = open_browser(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def notebook(lab, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)  # a loaded 2-core machine: clicks may wait for the page
    yield NotebookPage(page, lab)
    page.close()


def test_lecture0_runs_all_cells_in_the_browser(notebook):
    """Run → Run All Cells on lecture 0: every cell runs, no traceback, table and widgets shown."""
    code_cells = [
        c for c in nbformat.read(REPO / "notebooks" / LECTURE, 4).cells if c.cell_type == "code"
    ]
    notebook.open(LECTURE)
    notebook.clear_outputs()  # what is checked below comes from this run, not the stored outputs
    cells = [c for c in notebook.run_all(timeout=600) if c["kind"] == "code"]
    log = notebook.lab.log[-3000:]

    assert len(cells) == len(code_cells), "the page shows another number of code cells"
    prompts = [c["prompt"] for c in cells]
    assert prompts == [f"[{i}]:" for i in range(1, len(cells) + 1)], (
        f"not every cell ran, in order, once: {prompts}\n{tracebacks(cells)}\n{log}"
    )
    assert not tracebacks(cells), "\n".join(tracebacks(cells))
    assert not any(c["widgetErrors"] for c in cells), "a widget failed to display"
    # The doctor's table: one row per engine (plus the heading) and its verdict, as HTML.
    doctor = [c for c in cells if "cluster.doctor()" in c["source"]]
    assert doctor and doctor[0]["tables"] == 1, f"no doctor table: {doctor}"
    assert "every engine answered" in doctor[0]["text"], doctor[0]["text"][:500]
    # The engines' start-up progress bars: ipywidgets drawn by the page, not their text fallback.
    starts = [c for c in cells if "start_cluster(" in c["source"]]
    assert len(starts) == 2, [c["source"] for c in cells]
    for cell in starts:
        assert cell["progress"] >= 1, f"no progress widget drawn in {cell['source']!r}"
    # The exercise's check cell printed its verdict line (a stub: FAIL, not a traceback).
    assert "Exercise 0.1 sum_of_squares_on_engines: FAIL (not implemented yet" in cells[-2]["text"]


def test_assignment_check_cell_prints_its_verdict(notebook):
    """A1's set-up, answer and check cells, each run with Shift+Enter: the verdict line shows."""
    notebook.open(ASSIGNMENT)
    cells = []
    for index in range(3):  # set-up, the stubbed answer, its check
        cells = [c for c in notebook.run_cell(index, timeout=300) if c["kind"] == "code"]
    assert [c["prompt"] for c in cells[:3]] == ["[1]:", "[2]:", "[3]:"], cells[:3]
    assert not tracebacks(cells), "\n".join(tracebacks(cells))
    verdict = cells[2]["text"].strip()
    assert verdict.startswith("Exercise A1.1 smoothed_cross_entropy: FAIL (not implemented yet"), (
        verdict
    )
