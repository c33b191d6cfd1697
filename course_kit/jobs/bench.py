"""No lecture (the kit's plumbing). ``./kit bench``: list the benchmarks in ``bench/``, run one by name, or every one with ``--all``.

A benchmark's one-line summary is the first line of its module docstring (read, not imported).
Benchmarks that build an emulated room need root (network namespaces and ``tc``; their docstrings
say "Needs root"); ``--all`` skips them unless it runs as root, and the list names them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from course_kit.jobs.handover import ROOT, checkout_problem, hand_over, is_root

__all__ = ["Benchmark", "bench_job", "find_benchmarks", "listing", "run_all"]


@dataclass(frozen=True)
class Benchmark:
    """One script ``bench/bench_NAME.py``: its name, its summary line, whether it needs root."""

    name: str
    path: Path
    summary: str
    needs_root: bool


def _read(path: Path) -> Benchmark:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.strip().splitlines()[0] if doc.strip() else "(no docstring)"
    # Each benchmark that builds an emulated room says so: "Needs root, ``ip``, ``tc``, ...".
    needs_root = "needs root" in doc.lower()
    return Benchmark(path.stem.removeprefix("bench_"), path, first, needs_root)


def find_benchmarks(folder: Path = ROOT / "bench") -> list[Benchmark]:
    """Return every ``bench_*.py`` in ``folder``, sorted by name."""
    return [_read(path) for path in sorted(folder.glob("bench_*.py"))]


def listing(benchmarks: list[Benchmark]) -> str:
    """Return the usage and one line per benchmark (``./kit bench --help``)."""
    width = max(len(b.name) for b in benchmarks) + len(" (root)")
    lines = [
        "usage: ./kit bench NAME [ARGS...]   one benchmark (./kit bench NAME --help: its options)",
        "       ./kit bench --all            every one in turn; those marked "
        "(root) only when run as root",
        "benchmarks in bench/:",
    ]
    for b in benchmarks:
        label = f"{b.name} (root)" if b.needs_root else b.name
        lines.append(f"  {label:<{width}}  {b.summary}")
    return "\n".join(lines)


def run_all(benchmarks: list[Benchmark], as_root: bool) -> int:
    """Run every benchmark in turn (those needing root only ``as_root``); 1 if any failed."""
    failed = 0
    for b in benchmarks:
        where = b.path.relative_to(ROOT) if b.path.is_relative_to(ROOT) else b.path
        if b.needs_root and not as_root:
            print(f"== {where}: skipped, needs root (an emulated room): sudo ./kit bench {b.name}")
            continue
        print(f"== {where}", flush=True)
        done = subprocess.run([sys.executable, str(b.path)], cwd=ROOT, check=False)
        if done.returncode != 0:
            print(f"kit: {where} failed (exit {done.returncode})", file=sys.stderr)
            failed = 1
    return failed


def bench_job(argv: list[str]) -> int:
    """List, run one benchmark (handing over to it) or run all; return the exit status."""
    if (problem := checkout_problem("bench")) is not None:
        print(f"kit bench: {problem}", file=sys.stderr)
        return 2
    benchmarks = find_benchmarks()
    names = " ".join(b.name for b in benchmarks)
    if argv in (["-h"], ["--help"]):
        print(listing(benchmarks))
        return 0
    if not argv:  # running all of them takes an hour and some need root: ask first
        print(listing(benchmarks))
        print("kit bench: name a benchmark, or give --all to run every one", file=sys.stderr)
        return 2
    if argv[0] == "--all":
        if len(argv) > 1:
            print(
                f"kit bench: --all takes no arguments ({' '.join(argv[1:])}); give them to "
                "one benchmark: ./kit bench NAME ARGS",
                file=sys.stderr,
            )
            return 2
        return run_all(benchmarks, as_root=is_root())
    chosen = next((b for b in benchmarks if b.name == argv[0]), None)
    if chosen is None:
        print(
            f"kit: no benchmark named {argv[0]!r}; choose one of: {names} (or --all; "
            "./kit bench --help says what each measures)",
            file=sys.stderr,
        )
        return 2
    return hand_over([sys.executable, str(chosen.path), *argv[1:]], ROOT)
