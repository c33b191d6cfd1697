"""Every ``./kit`` job as Python: ``python -m course_kit JOB`` answers as ``./kit JOB`` does.

The cheap invocations of every job (help, ``--help``, bad arguments) run through the real ``kit``
bash script, in a copy of the checkout's wrapper whose ``.venv/bin/python`` is this Python behind
a shim that writes down the command line and folder it was given (so nothing is installed): the
wrapper must run exactly ``python -m course_kit JOB ARGS`` from its folder, the checkout's root,
so that command is the job's Python form, and its answer (exit status, output; bad input one line
without a traceback) is checked. Where the wrapper's command differs (it adds ``--check`` to
``setup``, ``help`` to no job) the Python form runs too and must answer the same. No test starts JupyterLab, a cluster
or the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_kit.jobs import JOBS, help_text
from course_kit.jobs.bench import Benchmark, find_benchmarks, run_all
from course_kit.lab.find import HOSTS_NOTE, remember_hosts_file

ROOT = Path(__file__).resolve().parents[3]
ROOT_ONLY = {
    "lab_faults",
    "lab_mpi",
    "lab_start",
    "large_batch_room",
    "network_doctor",
    "room",
    "slurm_startup",
    "wire_framing",
}


def _env(tmp_path: Path) -> dict[str, str]:
    """This checkout first on the path; an empty IPython folder (no running cluster is found)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, IPYTHONDIR=str(tmp_path / "ipython"))


def _python(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "course_kit", *argv],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a copy of the ``kit`` script whose ``.venv`` is this Python, already "installed".

    The script's own set-up check passes (the stamp is the checksum of the copied
    ``pyproject.toml``), so running it never installs anything, and it ends in
    ``exec .venv/bin/python -m course_kit JOB ...`` as in a checkout.
    """
    if shutil.which("bash") is None:
        pytest.skip("no bash here (Windows): ./kit is the bash wrapper of python -m course_kit")
    home = tmp_path_factory.mktemp("checkout")
    shutil.copy2(ROOT / "kit", home / "kit")
    shutil.copy2(ROOT / "pyproject.toml", home / "pyproject.toml")
    bin_dir = home / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    # the shim writes down its folder and argv (one per line: an argument may hold spaces) to
    # $KIT_ARGV_LOG when set, then becomes this Python: what runs is the command it was given
    (bin_dir / "python").write_text(
        '#!/bin/sh\nif [ -n "$KIT_ARGV_LOG" ]; then\n'
        '    { pwd; for a in "$@"; do printf "%s\\n" "$a"; done; } > "$KIT_ARGV_LOG"\nfi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    (bin_dir / "python").chmod(0o755)
    stamp = subprocess.run(
        "cat pyproject.toml | cksum",
        shell=True,
        cwd=home,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (home / ".venv" / ".kit-installed").write_text(stamp)
    return home / "kit"


def _kit(kit: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(kit), *argv], env=env, capture_output=True, text=True, timeout=300
    )


def _kit_jobs() -> set[str]:
    """Return the jobs that the ``kit`` script's ``case "$job"`` statement runs."""
    text = (ROOT / "kit").read_text()
    case = text[text.index('case "$job" in') : text.index("\nesac")]
    arms = re.findall(r"^    ([a-z0-9|]+)\)", case, flags=re.M)
    return {job for arm in arms for job in arm.split("|")}


def test_every_kit_job_has_a_python_form() -> None:
    jobs = _kit_jobs()
    assert {"setup", "lab", "test", "bench", "release", "grade", "check", "room"} <= jobs, jobs
    assert jobs == set(JOBS), f"kit runs {sorted(jobs)}, python -m course_kit has {sorted(JOBS)}"
    listed = help_text()
    for job in JOBS:  # ./kit help names every job (it used to omit setup, release, grade, check)
        assert re.search(rf"^  {job}\b", listed, flags=re.M), (job, listed)


def test_the_console_script_is_the_same_entry_point() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^course-kit = "course_kit\.jobs:main"$', text, flags=re.M), text
    installed = shutil.which("course-kit", path=str(Path(sys.executable).parent))
    if installed is None:
        pytest.skip("course-kit is not installed in this Python yet (pip install -e . makes it)")
    done = subprocess.run([installed, "help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == help_text()


# (argv, exit status, a piece of stdout or stderr). Every job, cheaply: help and bad input.
CASES = [
    ((), 0, "usage: ./kit JOB"),
    (("help",), 0, "python -m course_kit JOB"),
    (("nosuch",), 2, "kit: no job named 'nosuch'; choose one of: setup, lab"),
    (("setup", "--help"), 0, "usage: ./kit setup"),
    (("setup", "--bogus"), 2, "kit setup: unrecognized arguments: --bogus"),
    (("lab", "--help"), 0, "./kit lab start|status|stop HOSTS.toml"),
    (("lab", "status"), 1, "no lab cluster is running on this PC: start one with ./kit lab start"),
    (("lab", "stop"), 2, "kit lab stop: give the hosts file: ./kit lab stop HOSTS.toml"),
    (("lab", "start", "missing.toml"), 2, "kit lab start: missing.toml does not exist"),
    (("lab", "start", "--help"), 0, "--timeout"),
    (("demo", "--help"), 0, "usage: ./kit demo"),
    (("demo", "--engines", "1"), 2, "kit demo: --engines 1: give 2 or more engines"),
    (("test", "--help"), 0, "pytest tests notebooks -n 2 --dist loadfile"),
    (("bench", "--help"), 0, "usage: ./kit bench NAME"),
    (("bench",), 2, "kit bench: name a benchmark, or give --all to run every one"),
    (("bench", "nosuch"), 2, "kit: no benchmark named 'nosuch'; choose one of: all_to_all"),
    (("bench", "--all", "--quick"), 2, "kit bench: --all takes no arguments (--quick)"),
    (("doctor", "--help"), 0, "usage: ./kit doctor"),
    (("doctor",), 2, "kit doctor: give --profile NAME or --file PATH of the running cluster"),
    (("doctor", "--profile", "lab"), 1, "kit doctor: no cluster is running for profile 'lab'"),
    (("doctor", "--profile", "nosuch"), 1, "start the lab's with ./kit lab start HOSTS.toml"),
    (("room", "--help"), 0, "usage: ./kit room"),
    (("room",), 2, "kit room: the following arguments are required: action"),
    (("room", "up", "2", "--rate", "fast"), 1, "kit room up: rate 'fast': give a tc rate"),
    (("release", "--help"), 0, "--checks-dest"),
    (("release", "--bogus"), 2, "kit release: unrecognized arguments: --bogus"),
    (("grade", "--help"), 0, "submissions"),
    (("grade",), 2, "kit grade: the following arguments are required: submissions"),
    (("grade", "--self-test", "--bogus"), 2, "kit grade: unrecognized arguments: --bogus"),
    (("check", "--help"), 0, "notebook"),
    (("slides", "--help"), 0, "usage: ./kit slides"),
    (("slides", "x"), 2, "not a lecture number"),
    (("i18n", "--help"), 0, "usage: ./kit i18n"),
    (("lab", "--lang", "de"), 2, "kit lab: --lang 'de': the course has en and ru"),
    (("i18n", "check", "--lang", "xx"), 2, "i18n: no catalogues for 'xx' under locale/"),
    (("check", "missing.ipynb"), 2, "missing.ipynb does not exist: give the path of your saved"),
]


def _case_id(case: tuple) -> str:
    return " ".join(case[0]) or "(no job)"


@pytest.mark.parametrize("argv,status,text", CASES, ids=[_case_id(c) for c in CASES])
def test_python_form_answers_as_kit_does(
    kit: Path, tmp_path: Path, argv: tuple[str, ...], status: int, text: str
) -> None:
    env = _env(tmp_path)
    log = tmp_path / "argv.txt"
    bash = _kit(kit, dict(env, KIT_ARGV_LOG=str(log)), *argv)
    # the wrapper ran `python -m course_kit JOB ARGS` in its own folder (a checkout's root):
    # that command is the job's Python form, so its answer is the one checked below
    folder, *ran = log.read_text().splitlines()
    job, rest = (argv[0], list(argv[1:])) if argv else ("help", [])
    extra = ["--check"] if job == "setup" else []
    assert (folder, ran) == (str(kit.parent), ["-m", "course_kit", job, *extra, *rest])
    assert bash.returncode == status, bash.stdout + bash.stderr
    assert text in bash.stdout + bash.stderr, bash.stdout + bash.stderr
    assert "Traceback" not in bash.stderr, bash.stderr
    if status != 0:  # bad input: one line on stderr naming the fix
        assert len(bash.stderr.strip().splitlines()) == 1 or argv in (("lab", "status"),), (
            bash.stderr
        )
    if ran != ["-m", "course_kit", *argv]:  # the wrapper's command differs from the Python form
        python = _python(env, *argv)  # (setup gets --check, no job is help): the same answer
        assert (python.returncode, python.stdout, python.stderr) == (
            bash.returncode,
            bash.stdout,
            bash.stderr,
        )


def test_kit_help_needs_no_virtual_environment(tmp_path: Path) -> None:
    """On a fresh clone ``./kit help`` and a mistyped job are answered without installing."""
    if shutil.which("bash") is None or shutil.which("python3") is None:
        pytest.skip("needs bash and python3")
    shutil.copy2(ROOT / "kit", tmp_path / "kit")
    for package in ("course_lib", "course_grader", "course_kit"):
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        ["bash", str(tmp_path / "kit"), "help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == help_text(), done.stderr
    bad = subprocess.run(
        ["bash", str(tmp_path / "kit"), "tset"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("kit: no job named 'tset'"), bad.stderr
    assert not (tmp_path / ".venv").exists()


def test_bench_help_has_a_line_per_benchmark_and_names_the_root_only_ones(tmp_path: Path) -> None:
    done = _python(_env(tmp_path), "bench", "--help")
    benchmarks = find_benchmarks(ROOT / "bench")
    assert {b.name for b in benchmarks if b.needs_root} == ROOT_ONLY
    lines = done.stdout.splitlines()
    for b in benchmarks:
        first = b.path.read_text().split('"""')[1].strip().splitlines()[0]
        label = f"{b.name} (root)" if b.name in ROOT_ONLY else b.name
        assert sum(line.split()[: len(label.split())] == label.split() for line in lines) == 1, b
        assert any(line.strip().startswith(label) and line.endswith(first) for line in lines), b


def _script(folder: Path, name: str, doc: str, body: str) -> Benchmark:
    path = folder / f"bench_{name}.py"
    path.write_text(f'"""{doc}"""\n{body}\n')
    return find_benchmarks(folder)[[b.name for b in find_benchmarks(folder)].index(name)]


def test_bench_all_skips_root_only_benchmarks_and_reports_failures(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    marks = tmp_path / "ran"
    marks.mkdir()
    ran = f"open({str(marks)!r} + '/' + __file__.rsplit('/', 1)[-1], 'w').close()"
    plain = _script(tmp_path, "plain", "Benchmark a plain thing.", ran)
    room = _script(tmp_path, "roomy", "Benchmark a room.\n\nNeeds root, ``ip``, ``tc``.", ran)
    failing = _script(tmp_path, "failing", "Benchmark that fails.\n\nNeeds root.", "exit(3)")
    assert (plain.needs_root, room.needs_root, failing.needs_root) == (False, True, True)
    assert run_all([plain, room], as_root=False) == 0
    out = capfd.readouterr().out
    assert sorted(p.name for p in marks.iterdir()) == ["bench_plain.py"]
    assert "bench_roomy.py: skipped, needs root" in out and "sudo ./kit bench roomy" in out
    assert run_all([room, failing], as_root=True) == 1
    captured = capfd.readouterr()
    assert "bench_roomy.py" in {p.name for p in marks.iterdir()}
    assert "bench_failing.py failed (exit 3)" in captured.err


def test_bare_lab_status_finds_a_running_lab_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a hosts file, ``lab status`` finds the profile whose lab controller runs."""
    env = _env(tmp_path)
    monkeypatch.setenv("IPYTHONDIR", env["IPYTHONDIR"])  # for remember_hosts_file, here
    hosts = tmp_path / "hosts.toml"
    hosts.write_text("")
    security = tmp_path / "ipython" / "profile_room7" / "security"
    security.mkdir(parents=True)
    # What `lab start` leaves: ipyparallel's state file naming the controller's pid and the ssh
    # engine launcher. The "controller" is a real process here; it is only looked up by pid.
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        state = (
            f'{{"cluster": {{}}, "controller": {{"state": {{"pid": {controller.pid}}}}}, '
            '"engines": {"class": "ssh", "sets": {}}}'
        )
        (security / "cluster-.json").write_text(state)
        found = _python(env, "lab", "status")
        assert found.returncode == 0, found.stderr
        assert found.stdout.strip() == (
            f"lab cluster running in profile 'room7' (controller pid {controller.pid}); for its "
            "engines per PC give its hosts file: ./kit lab status HOSTS.toml"
        )
        remember_hosts_file("room7", hosts)  # a second start there will refuse: no note
        assert not (security / HOSTS_NOTE).exists()
    finally:
        controller.kill()
        controller.wait()
    gone = _python(env, "lab", "status")  # the controller's pid is gone: nothing runs
    assert gone.returncode == 1 and "no lab cluster is running" in gone.stdout, gone.stdout
    remember_hosts_file("room7", hosts)  # what `lab start` notes before it starts
    assert (security / HOSTS_NOTE).read_text().strip() == str(hosts.resolve())


def test_setup_check_reports_the_installed_kit(tmp_path: Path) -> None:
    done = _python(_env(tmp_path), "setup", "--check")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"kit: ready in {sys.prefix}: Python ") and "torch" in done.stdout


def test_kit_help_speaks_the_course_language(tmp_path: Path) -> None:
    """``COURSE_LANG=ru ./kit help``: the jobs' descriptions in Russian, their usage as in English."""
    done = _python(dict(_env(tmp_path), COURSE_LANG="ru"), "help")
    assert done.returncode == 0, done.stderr
    assert "этот список" in done.stdout and "this list" not in done.stdout, done.stdout
    for job in JOBS:  # the usage column is code: the same in every language
        assert re.search(rf"^  {job}\b", done.stdout, flags=re.M), (job, done.stdout)
