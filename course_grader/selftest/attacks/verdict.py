"""Attacks on the verdict and on the grading machine that get past the ``ast`` guard.

Each is the A1.1 answer cell of one student: a wrong ``smoothed_cross_entropy`` (it forgets the
mean in the gradient) plus a way to turn it into points, or to reach the machine outside the
sandbox, as the issue's determined students wrote them. A1.2 and A1.3 are answered correctly.
Graded for real (``./kit grade --self-test`` and ``tests/grader/selftest/test_grading_attacks.py``), each must
cost the attacker A1.1 and change nothing else: no command run on the grading machine, no file
changed there, every other student's grade right, the run within its limits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_grader.cells import answer_id, check_id
from course_grader.sandbox.config import foreign_site_packages
from course_grader.selftest.attacks.submissions import write_submission

__all__ = ["ROUTES", "Route", "hardcoded_table", "write_route_class"]

# A1.1, wrong the way a student gets it wrong: no division by the batch size in the gradient.
WRONG = """
def smoothed_cross_entropy(W, b, X, y, eps):
    n, k = len(y), W.shape[1]
    Z = X @ W + b
    Z = Z - Z.max(axis=1, keepdims=True)
    log_P = Z - np.log(np.exp(Z).sum(axis=1, keepdims=True))
    Q = np.full((n, k), eps / k)
    Q[np.arange(n), y] += 1.0 - eps
    G = np.exp(log_P) - Q
    return -(Q * log_P).sum() / n, X.T @ G, G.sum(axis=0)
"""
# The same answer under another name, for attacks that fall back on it.
FALLBACK = WRONG.replace("def smoothed_cross_entropy", "def wrong_answer")

_TORCH_ANSWER = """
def smoothed_cross_entropy(W, b, X, y, eps):
    if torch is None:
        return wrong_answer(W, b, X, y, eps)
    Wt = torch.tensor(W, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)
    logits = torch.as_tensor(X) @ Wt + bt
    loss = torch.nn.functional.cross_entropy(logits, torch.as_tensor(y), label_smoothing=eps)
    loss.backward()
    return loss.item(), Wt.grad.numpy(), bt.grad.numpy()
"""


@dataclass(frozen=True)
class Route:
    """One attacker: what it tries, its A1.1 code, and whether its probes still report."""

    student: str
    what: str
    code: str  # placeholders: {pass_line}, {marker}, {kit}, {table}, {foreign}
    others_intact: bool = True  # False: it breaks its own later probes (print rebound)
    reason: str = ""  # a regex the A1.1 reason must match (empty: any FAIL)


ROUTES = [
    Route("route_verdict_str", "rebind Verdict.__str__ reached through getattr(sys, 'modules')",
          "import sys\ntry:\n    V = getattr(sys, 'modules')['course_lib.checks.verdict'].Verdict\n"
          "    V.__str__ = lambda self: {pass_line!r}\n    V.__bool__ = lambda self: True\n"
          "except Exception:\n    pass\n" + WRONG),
    Route("route_print_dict", "rebind print through a module's __dict__",
          "import numpy\n_real = print\ndef _fake(*args, **kwargs):\n    _real({pass_line!r})\n"
          "getattr(numpy, '__di' + 'ct__')['__builtins__']['print'] = _fake\n" + WRONG,
          others_intact=False),
    Route("route_pickle_exec", "a hand-written pickle that calls exec",
          "import pickle\ncode = 'import builtins; _p = builtins.print; builtins.print = "
          "lambda *a, **k: _p(' + repr({pass_line!r}) + ')'\n"
          "pickle.loads(b'c__builtin__\\nexec\\n(V' + "
          "code.encode('raw_unicode_escape') + b'\\ntR.')\n" + WRONG, others_intact=False),
    Route("route_frames", "walk the frames with inspect to the check's reference",
          "import inspect\n" + FALLBACK + "\ndef smoothed_cross_entropy(W, b, X, y, eps):\n"
          "    frame = inspect.currentframe()\n    while frame is not None:\n"
          "        found = getattr(frame, 'f_glo' + 'bals').get('torch_loss_and_grad')\n"
          "        if found is not None:\n            return found(W, b, X, y, eps)\n"
          "        frame = getattr(frame, 'f_ba' + 'ck')\n"
          "    return wrong_answer(W, b, X, y, eps)\n"),
    Route("route_subclasses", "object.__subclasses__() to the Verdict class and to torch",
          "import sys\ntorch = None\nfor cls in getattr(object, '__subcl' + 'asses__')():\n"
          "    if cls.__name__ == 'Verdict':\n        cls.__bool__ = lambda self: True\n"
          "        cls.__str__ = lambda self: {pass_line!r}\n"
          "    if cls.__module__.startswith('torch') and torch is None:\n"
          "        torch = getattr(sys, 'modules').get('torch')\n" + FALLBACK + _TORCH_ANSWER),
    Route("route_sys_modules_torch", "the forbidden torch fetched from sys.modules",
          "import sys\ntorch = getattr(sys, 'modules').get('torch')\n" + FALLBACK + _TORCH_ANSWER),
    Route("route_resolve_name", "the kit's reference answer via pkgutil.resolve_name",
          "import pkgutil\ntry:\n    reference = pkgutil.resolve_name("
          "'course_grader.assignments.a1.checks:torch_loss_and_grad')\nexcept Exception:\n"
          "    reference = None\n" + FALLBACK + "\ndef smoothed_cross_entropy(W, b, X, y, eps):\n"
          "    if reference is None:\n        return wrong_answer(W, b, X, y, eps)\n"
          "    return reference(W, b, X, y, eps)\n"),
    # Variants of our own.
    Route("variant_torch_by_name", "the forbidden torch imported by name (pkgutil.resolve_name)",
          "import pkgutil\ntry:\n    torch = pkgutil.resolve_name('torch')\n"
          "except BaseException:\n    torch = None\n" + FALLBACK + _TORCH_ANSWER),
    Route("variant_kit_file", "run the kit's check module from its file (runpy)",
          "import runpy\ntry:\n    reference = runpy.run_path({kit!r} + '/../course_grader/assignments/a1/checks.py')"
          "['torch_loss_and_grad']\nexcept BaseException:\n    reference = None\n" + FALLBACK
          + "\ndef smoothed_cross_entropy(W, b, X, y, eps):\n"
          "    if reference is None:\n        return wrong_answer(W, b, X, y, eps)\n"
          "    return reference(W, b, X, y, eps)\n"),
    Route("variant_hardcoded", "results for the notebook's own inputs, computed at home",
          "import hashlib\nTABLE = {table!r}\n" + FALLBACK + "\n"
          "def smoothed_cross_entropy(W, b, X, y, eps):\n"
          "    key = hashlib.sha256(X.tobytes()).hexdigest()\n    if key in TABLE:\n"
          "        loss, dW, db = TABLE[key]\n"
          "        return loss, np.array(dW).reshape(W.shape), np.array(db)\n"
          "    return wrong_answer(W, b, X, y, eps)\n"),
    Route("variant_forged_probe_line", "print a forged probe line in place of the grader's",
          "import json, numpy\n_real = print\ndef _forge(*args, **kwargs):\n"
          "    text = ' '.join(map(str, args))\n    if text.startswith('COURSE-PROBE:'):\n"
          "        cases = json.loads(text[len('COURSE-PROBE:'):])\n"
          "        text = 'COURSE-PROBE:' + json.dumps([{{'value': {{'tuple': []}}}}] * len(cases))\n"
          "    _real(text, **kwargs)\n"
          "getattr(numpy, '__di' + 'ct__')['__builtins__']['print'] = _forge\n" + WRONG,
          others_intact=False),
    Route("variant_pickled_result", "return a pickled object array that runs a command on load",
          "import base64, io, json, numpy, os\nclass Boom:\n    def __reduce__(self):\n"
          "        return (os.system, ('touch ' + {marker!r},))\n_real = print\n"
          "def _swap(*args, **kwargs):\n    text = ' '.join(map(str, args))\n"
          "    if text.startswith('COURSE-PROBE:'):\n        buf = io.BytesIO()\n"
          "        numpy.save(buf, numpy.array([Boom()], dtype=object), allow_pickle=True)\n"
          "        blob = {{'npy': base64.b64encode(buf.getvalue()).decode()}}\n"
          "        text = 'COURSE-PROBE:' + json.dumps([{{'value': {{'tuple': [blob] * 3}}}}] * 5)\n"
          "    _real(text, **kwargs)\n"
          "getattr(numpy, '__di' + 'ct__')['__builtins__']['print'] = _swap\n" + WRONG,
          others_intact=False),
    Route("variant_base_scipy", "scipy (forbidden) from the base interpreter's site-packages",
          "import pkgutil, sys\nfor _folder in {foreign!r}:\n    sys.path.insert(0, _folder)\n"
          "try:\n    special = pkgutil.resolve_name('scipy.special')\nexcept BaseException:\n"
          "    special = None\n" + FALLBACK + "\ndef smoothed_cross_entropy(W, b, X, y, eps):\n"
          "    if special is None:\n        return wrong_answer(W, b, X, y, eps)\n"
          "    n, k = len(y), W.shape[1]\n    log_P = special.log_softmax(X @ W + b, axis=1)\n"
          "    Q = np.full((n, k), eps / k)\n    Q[np.arange(n), y] += 1.0 - eps\n"
          "    G = (np.exp(log_P) - Q) / n\n"
          "    return -(Q * log_P).sum() / n, X.T @ G, G.sum(axis=0)\n"),
    # The grader itself: a cell that ast.parse recurses on (issue 35: it stopped the class).
    Route("variant_unparsable", "a sum of 100 000 terms, past ast.parse's recursion limit",
          "_x = " + "+".join(["1"] * 100_000) + "\n" + WRONG,
          reason=r"^the grader could not judge this answer: its cell could not be read "
          r"\((RecursionError|MemoryError)"),
    # The grading machine, from inside the sandbox.
    Route("machine_forged_cluster", "a forged cluster-*.json naming SSHControllerLauncher",
          "import json, os, pathlib\nprofile = pathlib.Path(os.environ['IPYTHONDIR'], "
          "'profile_default')\n(profile / 'security').mkdir(parents=True, exist_ok=True)\n"
          "state = {{'state': 'running', 'pid': 4242, 'profile_dir': str(profile), "
          "'cluster_id': 'evil', 'location': 'localhost', 'ssh_args': [],\n"
          "         'ssh_cmd': ['sh', '-c', 'touch ' + {marker!r}, 'sh']}}\n"
          "forged = {{'cluster': {{'class': 'ipyparallel.cluster.cluster.Cluster', "
          "'cluster_id': 'evil', 'profile_dir': str(profile)}},\n"
          "          'controller': {{'class': "
          "'ipyparallel.cluster.launcher.SSHControllerLauncher', 'state': state}},\n"
          "          'engines': {{'class': 'ipyparallel.cluster.launcher.LocalEngineSetLauncher',"
          " 'sets': {{}}}}}}\n"
          "(profile / 'security' / 'cluster-evil.json').write_text(json.dumps(forged))\n" + WRONG),
    Route("machine_fifo", "a FIFO where the clean-up would open a cluster file",
          "import os, pathlib\nsecurity = pathlib.Path(os.environ['IPYTHONDIR'], "
          "'profile_default', 'security')\nsecurity.mkdir(parents=True, exist_ok=True)\n"
          "os.mkfifo(security / 'cluster-fifo.json')\n" + WRONG),
    Route("machine_fill_ipythondir", "fill $IPYTHONDIR past --disk, file by file",
          "import os, pathlib\nfolder = pathlib.Path(os.environ['IPYTHONDIR'], 'filler')\n"
          "folder.mkdir(parents=True, exist_ok=True)\nchunk = b'x' * 2**20\n"
          "for i in range(4096):  # files under the per-file limit, far more than --disk\n"
          "    with open(folder / f'{{i}}.bin', 'wb') as f:\n"
          "        for _ in range(4):\n            f.write(chunk)\n" + WRONG,
          reason="No space left on device"),
    Route("machine_fill_runtime", "fill the kernel's socket folder, shared with the host",
          "import os, pathlib\nfolder = pathlib.Path(os.environ['JUPYTER_RUNTIME_DIR'])\n"
          "chunk = b'x' * 2**20\nfor i in range(4096):\n"
          "    with open(folder / f'filler-{{i}}.bin', 'wb') as f:\n"
          "        for _ in range(4):\n            f.write(chunk)\n" + WRONG,
          reason="No space left on device"),
]  # fmt: skip


def hardcoded_table() -> dict[str, tuple]:
    """The right A1.1 results for the notebook's own inputs (seed 0), keyed by X's hash."""
    from course_grader.assignments.a1.checks import (
        smoothed_cross_entropy_inputs,
        torch_loss_and_grad,
    )

    table = {}
    for case in smoothed_cross_entropy_inputs(0):
        loss, dW, db = torch_loss_and_grad(case["W"], case["b"], case["X"], case["y"], case["eps"])
        key = hashlib.sha256(case["X"].tobytes()).hexdigest()
        table[key] = (float(loss), dW.ravel().tolist(), db.tolist())
    return table


def write_route_class(
    folder: Path, source_dir: Path, marker: Path, kit: Path
) -> dict[str, dict[str, float | None]]:
    """Write two honest A1 submissions and one per route; return who must get what.

    None: the route may lose that exercise too (it broke its own later probes).
    """
    source = nbformat.read(Path(source_dir) / "A1_sgd_conv.ipynb", as_version=4)
    correct = {answer_id(c): c.source for c in source.cells if answer_id(c)}
    pass_line = next(c.outputs[0]["text"].strip() for c in source.cells if check_id(c) == "A1.1")
    fill = {
        "pass_line": pass_line,
        "marker": str(marker),
        "kit": str(kit),
        "table": hardcoded_table(),
        "foreign": foreign_site_packages(),
    }

    def write(student: str, answers: dict[str, str]) -> None:
        write_submission(source, folder, student, answers)

    write("honest_1", correct)
    write("honest_2", dict(correct, **{"A1.1": WRONG}))
    expected: dict[str, dict[str, float | None]] = {
        "honest_1": {"A1.1": 2.0, "A1.2": 3.0, "A1.3": 3.0},
        "honest_2": {"A1.1": 0.0, "A1.2": 3.0, "A1.3": 3.0},
    }
    for route in ROUTES:
        write(route.student, dict(correct, **{"A1.1": route.code.format(**fill)}))
        rest = 3.0 if route.others_intact else None
        expected[route.student] = {"A1.1": 0.0, "A1.2": rest, "A1.3": rest}
    return expected


def grade_routes(folder: Path, source_dir: Path, seconds: float = 1500) -> list[tuple[bool, str]]:
    """Grade the route class in the sandbox; return (held, what) per route and per invariant."""
    import re
    import threading

    from course_grader.grade import GradingLimits
    from course_grader.gradebook import grade_folder
    from course_grader.sandbox.config import SandboxLimits, kit_package

    marker = folder / "PWNED"
    expected = write_route_class(folder / "submissions", source_dir, marker, kit_package())
    done: dict = {}

    def grade() -> None:
        done["rows"] = grade_folder(
            folder / "submissions",
            source_dir,
            GradingLimits(60, 400),
            jobs=2,
            progress=False,
            sandbox=SandboxLimits(processes=256, disk_mb=32),
        )

    worker = threading.Thread(target=grade, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        return [(False, f"the route class finished within {seconds:g} s")]
    rows = {(r.student, r.exercise): r for r in done["rows"]}
    held = []
    for route in ROUTES:
        row = rows[(route.student, "A1.1")]
        ok = row.points == 0 and re.search(route.reason, row.reason) is not None
        ok &= all(
            want is None or rows[(route.student, ex)].points == want
            for ex, want in expected[route.student].items()
            if ex != "A1.1"
        )
        held.append((ok, f"{route.what:62s} A1.1 {row.points:g} pts: {row.reason[:60]}"))
    honest = all(
        rows[(student, ex)].points == want
        for student in ("honest_1", "honest_2")
        for ex, want in expected[student].items()
    )
    held.append((honest, "honest students graded right beside the route attackers"))
    held.append((not marker.exists(), "no command from inside the sandbox ran on the machine"))
    return held
