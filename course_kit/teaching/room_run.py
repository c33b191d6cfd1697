"""No lecture (the lecturer's documents). Each engine lecture run in the emulated room; its cells' times stored for the syllabus and the notes.

``python -m course_kit.teaching.room_run [NN ...]`` builds the room the room tests use (two PCs of
two engines each and four MPI ranks, every link shaped to 1 Gbit/s), starts the lab, and runs each
lecture that starts engines as a student connected to it would (``jupyter nbconvert --execute``
with ``COURSE_CLUSTER_FILE``). Every code cell's seconds, as Jupyter timed it, go to
``docs/teaching/room_times.json`` with the machine's load before and after each lecture; the
syllabus and the notes read them (``python -m course_kit.teaching.generate``). The emulated PCs
share this machine's cores: the room's times add the links' and the seats' cost to the 2-core
run, not a real room's extra cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from course_kit.room.state import lab_folder, room_down
from course_kit.teaching.measure import NOTEBOOKS, lecture_facts, lecture_notebooks
from course_lib.files import atomic_write_text

__all__ = ["ROOM", "ROOM_TIMES", "RoomRun", "engine_lectures", "main", "read_room_times"]

ROOT = Path(__file__).resolve().parents[2]
ROOM_TIMES = ROOT / "docs" / "teaching" / "room_times.json"
#: The room every room test and this run use: ``./kit room up`` arguments.
ROOM = ("2", "--engines", "2", "--mpi-ranks", "4")


@dataclass(frozen=True)
class RoomRun:
    """One lecture's run in the room: its cells' seconds by index (with first lines) and the load."""

    seconds: dict[int, float]
    first_lines: dict[int, str]
    load: tuple[float, float]

    @property
    def run_seconds(self) -> float:
        """Return the lecture's run time in the room (the sum of its cells')."""
        return sum(self.seconds.values())


def engine_lectures(folder: Path = NOTEBOOKS) -> dict[int, Path]:
    """Return the lectures whose code starts engines (``start_cluster``): the ones the room runs."""
    return {n: p for n, p in lecture_notebooks(folder).items() if lecture_facts(p).engine_lecture}


def read_room_times(path: Path = ROOM_TIMES) -> dict[int, RoomRun]:
    """Return the stored room runs by lecture (none when nothing was measured yet)."""
    if not path.is_file():
        return {}
    stored = json.loads(path.read_text(encoding="utf-8"))
    return {
        int(n): RoomRun(
            {int(k): float(v) for k, v in run["seconds"].items()},
            {int(k): str(v) for k, v in run["first_lines"].items()},
            (float(run["load"][0]), float(run["load"][1])),
        )
        for n, run in stored["lectures"].items()
    }


def _kit(env: dict[str, str], *argv: str, timeout: float = 900) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "course_kit.jobs.cluster", *argv],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"./kit {' '.join(argv[:4])} failed: {done.stderr.strip()[-600:]}")
    return done.stdout


def _run_lecture(notebook: Path, student: dict[str, str], out: Path) -> RoomRun:
    load_before = os.getloadavg()[0]
    subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.timeout=900", "--output-dir", str(out), str(notebook)],
        env=student, check=True, capture_output=True, timeout=1800, cwd=notebook.parent,
    )  # fmt: skip
    facts = lecture_facts(out / notebook.name)
    return RoomRun(
        {c.index: round(c.seconds, 2) for c in facts.cells},
        {c.index: c.first_line for c in facts.cells},
        (round(load_before, 2), round(os.getloadavg()[0], 2)),
    )


def _store(runs: dict[int, RoomRun], path: Path) -> None:
    stored = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"lectures": {}}
    stored.update(
        what="each engine lecture run by a student connected to the emulated room "
        f"(./kit room up {' '.join(ROOM)}; links 1 Gbit/s) on this machine's "
        f"{os.cpu_count()} cores: python -m course_kit.teaching.room_run",
        measured=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
    for n, run in runs.items():
        stored["lectures"][f"{n:02d}"] = {
            "run_seconds": round(run.run_seconds, 1),
            "load": list(run.load),
            "seconds": {str(k): v for k, v in run.seconds.items()},
            "first_lines": {str(k): v for k, v in run.first_lines.items()},
        }
    stored["lectures"] = dict(sorted(stored["lectures"].items()))
    atomic_write_text(path, json.dumps(stored, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen engine lectures (default: all) in a fresh emulated room; store their times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lectures", nargs="*", type=int, help="lecture numbers (default: all)")
    args = parser.parse_args(argv)
    lectures = engine_lectures()
    chosen = args.lectures or sorted(lectures)
    unknown = [n for n in chosen if n not in lectures]
    if unknown:
        print(f"room_run: no engine lecture {unknown}; choose from {sorted(lectures)}")
        return 2
    with tempfile.TemporaryDirectory(prefix="room-run-") as tmp:
        folder = Path(tmp)
        instructor = dict(os.environ, IPYTHONDIR=str(folder / "instructor"), OMP_NUM_THREADS="1")
        state = folder / "room.json"
        hosts = lab_folder(state) / "hosts.toml"
        student = {k: v for k, v in os.environ.items() if not k.startswith("COURSE_CLUSTER_")}
        security = folder / "instructor" / "profile_lab" / "security"
        student.update(
            COURSE_CLUSTER_FILE=str(security / "ipcontroller-client.json"),
            IPYTHONDIR=str(folder / "student"),
        )
        runs: dict[int, RoomRun] = {}
        try:
            print(
                f"room_run: building the room ({' '.join(ROOM)}) and starting the lab", flush=True
            )
            _kit(instructor, "room", "--state", str(state), "up", *ROOM)
            _kit(instructor, "lab", "start", str(hosts), "--timeout", "600")
            for n in chosen:
                started = time.monotonic()
                print(f"room_run: lecture {n:02d} ({lectures[n].name}) ...", flush=True)
                runs[n] = _run_lecture(lectures[n], student, folder / "out")
                print(
                    f"room_run: lecture {n:02d}: {runs[n].run_seconds:.0f} s of cells "
                    f"({time.monotonic() - started:.0f} s with the kernel's start), "
                    f"load {runs[n].load[0]:.1f} -> {runs[n].load[1]:.1f}",
                    flush=True,
                )
                _store({n: runs[n]}, ROOM_TIMES)  # each lecture kept as soon as it is measured
        finally:
            subprocess.run(
                [sys.executable, "-m", "course_kit.jobs.cluster", "lab", "stop", str(hosts)],
                env=instructor, capture_output=True, timeout=300, cwd=ROOT,
            )  # fmt: skip
            room_down(state)
    print(f"room_run: {len(runs)} lectures stored in {ROOM_TIMES.relative_to(ROOT)}; "
          "then: python -m course_kit.teaching.generate")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
