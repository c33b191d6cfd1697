"""Walk through the lectures in JupyterLab in headless Chromium, as a student sees them.

For each notebook: open it in Lab (started as ``./kit lab`` starts it), optionally run it through
Run → Run All Cells (``--run``, noting how long each cell showed ``[*]``), then take screenshots
page by page and list what a student would trip on: tracebacks, stderr noise, outputs taller than
a screen, figures drawn smaller than they were rendered, widgets that failed to display.

    python bench/browser_walkthrough.py [--run] [--out DIR] [00 01 ...]

Needs playwright and a Chromium (Debian: apt install chromium). Screenshots go to
``bench/results/browser/`` by default. Not a benchmark of speed: the times are only a guide.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from browser_lab import (  # noqa: E402 - the helper lives beside the browser test
    REPO,
    JupyterLabServer,
    NotebookPage,
    browser_skip_reason,
    open_browser,
    tracebacks,
)

SCREEN = {"width": 1400, "height": 1000}
TALL_OUTPUT_PX = 1200  # an output taller than a screen makes the student scroll past it
SLOW_CELL_S = 20.0

_SCROLL_JS = """
(y) => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const scroller = Array.from(panel.querySelectorAll('*'))
    .find((e) => e.scrollHeight > e.clientHeight + 10 && getComputedStyle(e).overflowY !== 'visible');
  if (!scroller) return [0, 0];
  scroller.scrollTop = y;
  return [scroller.scrollTop, scroller.scrollHeight];
}
"""


def _timed_run(notebook: NotebookPage, timeout: float) -> dict[int, float]:
    """Run all cells; return how long each code cell showed [*] while first in line (s)."""
    notebook.menu("Run", "Run All Cells")
    busy: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while time.monotonic() < deadline:
        notebook.page.wait_for_timeout(1000)
        now = time.monotonic()
        prompts = [c["prompt"] for c in notebook.cells() if c["kind"] == "code"]
        running = next((i for i, p in enumerate(prompts) if "*" in p), None)
        if running is None and notebook.page.evaluate(
            "() => !!document.querySelector('.jp-StatusBar-TextItem[title^=\"Change kernel\"]')"
            " && document.querySelector('.jp-StatusBar-TextItem[title^=\"Change kernel\"]')"
            ".textContent.endsWith('Idle')"
        ):
            break
        if running is not None:
            busy[running] = busy.get(running, 0.0) + (now - last)
        last = now
        notebook.lab.remember_processes()
    return busy


def _screenshots(notebook: NotebookPage, stem: Path) -> list[Path]:
    paths, y = [], 0
    while True:
        top, height = notebook.page.evaluate(_SCROLL_JS, y)
        notebook.page.wait_for_timeout(400)
        path = stem.with_name(f"{stem.name}_{len(paths):02d}.png")
        notebook.page.screenshot(path=str(path))
        paths.append(path)
        y = top + SCREEN["height"] - 150
        if y >= height - 100 or len(paths) >= 60:
            return paths


def walk(name: str, notebook: NotebookPage, out: Path, run: bool) -> list[str]:
    """Open (and run) one notebook; return the notes on what a student would trip on."""
    notebook.open(name)
    busy = {}
    if run:
        notebook.clear_outputs()
        started = time.monotonic()
        busy = _timed_run(notebook, timeout=1800)
        notes = [f"ran in {time.monotonic() - started:.0f} s through the page"]
    else:
        notes = ["stored outputs (not run)"]
    cells = [c for c in notebook.cells() if c["kind"] == "code"]
    notes += tracebacks(cells)
    for i, cell in enumerate(cells):
        where = f"code cell {i} ({cell['source'][:40]!r})"
        if busy.get(i, 0) > SLOW_CELL_S:
            shown = "with output" if cell["text"].strip() else "SILENT"
            notes.append(f"{where}: {busy[i]:.0f} s, {shown}, progress bars {cell['progress']}")
        if cell["outputHeight"] > TALL_OUTPUT_PX:
            notes.append(f"{where}: output {cell['outputHeight']} px tall")
        for natural_w, natural_h, shown_w in cell["images"]:
            if shown_w and shown_w < 0.7 * natural_w:
                notes.append(f"{where}: figure {natural_w}x{natural_h} shrunk to {shown_w} px")
            if natural_w and natural_w < 450:
                notes.append(f"{where}: small figure {natural_w}x{natural_h}")
        if cell["widgetErrors"]:
            notes.append(f"{where}: a widget failed to display")
        for text in cell["stderr"]:
            if text.strip() and text not in "".join(tracebacks([cell])):
                notes.append(f"{where}: stderr {text.strip()[:160]!r}")
    shots = _screenshots(notebook, out / Path(name).stem)
    notes.append(f"{len(shots)} screenshots: {shots[0].parent}/{Path(name).stem}_NN.png")
    return notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lectures", nargs="*", help="notebook prefixes (default: every lecture)")
    parser.add_argument("--run", action="store_true", help="run every cell through the page")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "browser")
    args = parser.parse_args()
    reason = browser_skip_reason()
    if reason:
        print(f"browser_walkthrough: {reason}", file=sys.stderr)
        return 2
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp(prefix="course-ipython-"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    names = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if args.lectures:
        names = [n for n in names if any(n.startswith(want) for want in args.lectures)]
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with JupyterLabServer() as lab, sync_playwright() as playwright:
        browser = open_browser(playwright)
        for name in names:
            page = browser.new_page(viewport=SCREEN)
            page.set_default_timeout(300_000)
            notes = walk(name, NotebookPage(page, lab), args.out, args.run)
            print(f"== {name}", *notes, sep="\n  ", flush=True)
            page.close()
        browser.close()
    if lab.leftovers:
        print("processes that outlived JupyterLab (killed):", *lab.leftovers, sep="\n  ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
