"""No lecture (the kit's plumbing). ``./kit slides NN|all [--out DIR] [--offline]``: a reveal.js deck per lecture from its stored outputs (``jupyter nbconvert --to slides``).

Nothing is executed: the deck shows the outputs stored in the notebook. A cell's slide type comes
from its slide tags (set by ``python -m course_kit.teaching.annotate``): ``slide-title``,
``slide-section`` and ``slide-exercise`` start a slide, a ``slide-figure`` or ``slide-live`` code
cell is a fragment of the current one, the rest follows on the same slide. A notebook without
tags gets a slide per ``##`` heading. The lecturer presents from the deck, or from the live
notebook. reveal.js itself is loaded from its CDN when the deck opens (nbconvert's default), or,
with ``--offline``, from a copy written beside the decks (``reveal_offline/``; see its README).
"""

from __future__ import annotations

import copy
import shutil
import sys
from pathlib import Path

from course_kit.jobs.handover import ROOT, KitParser

__all__ = ["OUT", "build_deck", "slide_type", "slides_job"]

OUT = ROOT / "build" / "slides"
OFFLINE = Path(__file__).with_name("reveal_offline")  # reveal.js, require.js, jQuery (README)
_STARTS = ("slide-title", "slide-section", "slide-exercise")


def slide_type(cell: dict) -> str:
    """Return nbconvert's slide type of a cell from its slide tags (or, untagged, its heading)."""
    tags = cell.get("metadata", {}).get("tags", [])
    source = "".join(cell.get("source", ""))
    if any(t in tags for t in _STARTS):
        return "slide"
    if not any(t.startswith("slide-") for t in tags) and cell.get("cell_type") == "markdown":
        if source.startswith(("# ", "## ")):
            return "slide"
    if "slide-figure" in tags or "slide-live" in tags:
        return "fragment"
    return "-"


def build_deck(notebook: Path, out: Path, offline: bool = False) -> Path:
    """Write ``out/NN_name.slides.html`` from ``notebook``'s stored outputs; return its path.

    ``offline``: copy reveal.js, require.js and jQuery to ``out/reveal_offline`` and load them
    from there, so the deck opens without the internet.
    """
    import nbformat
    from nbconvert import SlidesExporter

    from course_lib.files import atomic_write_text

    nb = nbformat.read(notebook, as_version=4)
    deck = copy.deepcopy(nb)
    for cell in deck.cells:
        cell.metadata.setdefault("slideshow", {})["slide_type"] = slide_type(cell)
    exporter = SlidesExporter()
    if offline:
        shutil.copytree(OFFLINE, out / OFFLINE.name, dirs_exist_ok=True)
        exporter.reveal_url_prefix = f"{OFFLINE.name}/reveal.js"  # relative to the deck
        exporter.require_js_url = f"{OFFLINE.name}/require.js"
        exporter.jquery_url = f"{OFFLINE.name}/jquery.min.js"
    html, _ = exporter.from_notebook_node(deck)
    # nbconvert's slide-change handler calls MathJax unguarded: without it (offline, or its CDN
    # blocked) every slide change raised "MathJax is not defined".
    html = html.replace("if(MathJax.Hub.getAllJax(", "if(window.MathJax && MathJax.Hub.getAllJax(")
    path = atomic_write_text(out / f"{notebook.stem}.slides.html", html)
    path.chmod(0o644)  # a deck is served to a room: readable by all, as nbconvert's own are
    return path


def _parser() -> KitParser:
    parser = KitParser(
        prog="./kit slides",
        description="Build reveal.js decks from the lectures' stored outputs (nothing is run).",
    )
    parser.add_argument("which", help="a lecture number (e.g. 03 or 3) or 'all'")
    parser.add_argument(
        "--out", type=Path, default=OUT, help=f"folder of the decks (default {OUT})"
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="copy reveal.js beside the decks so they open without the internet",
    )
    return parser


def slides_job(argv: list[str]) -> int:
    """Build one lecture's deck or all of them; print each deck's path; return the status."""
    args = _parser().parse_args(argv)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if args.which != "all":
        if not args.which.isdigit():
            print(
                f"kit slides: {args.which!r} is not a lecture number or 'all' (e.g. ./kit slides 03)",
                file=sys.stderr,
            )
            return 2
        notebooks = [p for p in notebooks if int(p.name[:2]) == int(args.which)]
        if not notebooks:
            print(
                f"kit slides: no lecture {args.which} in notebooks/ (./kit slides all builds every one)",
                file=sys.stderr,
            )
            return 2
    for notebook in notebooks:
        print(build_deck(notebook, args.out, offline=args.offline))
    return 0
