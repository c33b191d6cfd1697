"""Shared test set-up: every test session gets its own IPython directory, so the clusters the
tests and notebooks start never touch (or collide with) the user's own profiles."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LECTURE_ANSWERS = Path(__file__).resolve().parents[1] / "assignments" / "source" / "lectures"
TESTS = Path(__file__).resolve().parent
#: tests/ and every folder of tests under it (a module's functions reach the engines by its name).
TEST_FOLDERS = [TESTS] + sorted(
    d for d in TESTS.rglob("*") if d.is_dir() and any(d.glob("test_*.py"))
)


def pytest_configure(config: pytest.Config) -> None:
    """Point IPYTHONDIR at a fresh folder before any engine or notebook kernel starts."""
    if "COURSE_KEEP_IPYTHONDIR" not in os.environ:
        os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="course-ipython-")
    # Functions defined in a test module are shipped to engines by reference to that module,
    # so the engines (started with this process's environment) must be able to import it.
    # The instructor's answers to lecture exercises (assignments/source/lectures/lectureNN_answers.py)
    # are imported by name in the tests that prove each answer passes and each stub fails.
    # The tests mirror the packages (tests/lib/..., tests/grader/..., tests/kit/...): every folder
    # of them is on the path, and tests/ itself for the helper modules shared across folders.
    answers_dir = str(LECTURE_ANSWERS)
    for folder in [answers_dir, *(str(d) for d in TEST_FOLDERS)]:
        if folder not in sys.path:
            sys.path.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (*map(str, TEST_FOLDERS), answers_dir, os.environ.get("PYTHONPATH", "")) if p
    )
    # Notebooks and tests pick their own cluster; a developer's lab settings must not leak in.
    for name in ("COURSE_CLUSTER_KIND", "COURSE_CLUSTER_PROFILE", "COURSE_CLUSTER_FILE"):
        os.environ.pop(name, None)
    # Two xdist workers share two cores: a test, a notebook's kernel or a grader's run computing
    # with torch's default of one OpenMP thread per core oversubscribes them, and the threads
    # spin-wait for each other (tests/lib/transformer and tests/lib/strategy beside a busy
    # machine, two runs each: 33 CPU-s in 30-33 s with one thread, 37-39 CPU-s in 42-44 s with
    # two). Engines are unaffected: start_cluster gives each cores // n threads itself.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not hasattr(config, "workerinput"):  # once, before xdist's workers start
        _compile_the_packages()


def _compile_the_packages() -> None:
    """Byte-compile the three packages before any test imports them.

    The grader's guard watches the kit's files while it grades unisolated, and the other xdist
    worker goes on meanwhile: nothing it does may write into the kit. Compiled first, no import
    of a test's writes a ``.pyc`` there (tests/grader/sandbox/test_kit_cut.py compiles only what
    is missing).
    """
    import compileall

    root = Path(__file__).resolve().parents[1]
    for package in ("course_lib", "course_grader", "course_kit"):
        compileall.compile_dir(root / package, quiet=2)


# -- the kit's files: watched by every grading run, changed by one module ---------------------------
@contextlib.contextmanager
def kit_lock(exclusive: bool) -> Iterator[None]:
    """Hold this checkout's kit shared (a grader's guard watches it) or exclusive (a test changes it).

    A lock file per checkout in the temp folder, taken with ``flock``: both xdist workers (and
    any second run of the same checkout) see it, and the kernel drops it if a worker dies.
    """
    key = hashlib.sha256(str(Path(__file__).resolve().parents[1]).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"course-kit-{key}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="module", autouse=True)
def _kit_held_by_grading_modules(request: pytest.FixtureRequest) -> Iterator[None]:
    """Grading modules hold the kit shared; a module with ``CHANGES_THE_KIT`` holds it alone."""
    if not request.module.__name__.rpartition(".")[2].startswith("test_grading"):
        yield
        return
    with kit_lock(exclusive=getattr(request.module, "CHANGES_THE_KIT", False)):
        yield


# -- one pool of local engines for the modules that only use engines ------------------------------
SHARED_ENGINES = 4  # the most any sharing module needs; a module takes the first n of them


def _import_torch() -> None:
    import torch  # noqa: F401 - the engines' first torch import, paid once per session


def _forget_communicators() -> None:
    """Run on an engine: drop what an earlier module left (its process group, the run's comm key).

    gloo allows one default process group per process, so a later module's communicator
    replaces an earlier one; dropping it here makes a stale ``comm`` fail loudly and makes
    ``ensure_communicators`` build ``dp_comm`` afresh instead of trusting its remembered key.
    """
    import sys

    from IPython import get_ipython

    ns = get_ipython().user_ns
    ns.pop("_course_dp_comm_key", None)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def local_engines():
    """Four local engines started once per session (on first use) and stopped at its end.

    Take them through ``shared_engines(n)``. Tests that kill, restart or interrupt engines must
    start a cluster of their own instead: this pool is shared by every module that uses it.
    """
    from course_lib.cluster import start_cluster

    with start_cluster("local", SHARED_ENGINES) as cluster:
        cluster.run(_import_torch, timeout=300)
        yield cluster


@pytest.fixture(scope="session")
def shared_engines(local_engines):
    """Return ``take(n)``: a cluster over the first ``n`` pooled engines, reset for a new module.

    Every engine's process group and remembered data-parallel communicator are dropped, and the
    ``n`` taken get ``rank`` / ``world_size`` as if started alone; the cluster it returns shares
    the pool's client and stops nothing (do not use it as a context manager).
    """
    from dataclasses import replace

    from course_lib.cluster import engine_side
    from course_lib.cluster.course_cluster import CourseCluster
    from course_lib.cluster.settings import threads_per_engine

    pool = local_engines

    def take(n: int) -> CourseCluster:
        if not 1 <= n <= pool.world_size:
            raise ValueError(f"n={n}: the shared pool has {pool.world_size} engines")
        pool.run(_forget_communicators, timeout=120)
        ids = list(pool.ids_by_rank[:n])
        sub = CourseCluster(replace(pool.settings, n=n), pool.client, owned=None)
        sub.ids_by_rank, sub.world_size = ids, n
        sub.engine_info = {eid: pool.engine_info[eid] for eid in ids}
        threads = threads_per_engine(sub.settings, n)  # what a cluster of n alone would get
        for rank, eid in enumerate(ids):
            pool.client[eid].apply_sync(
                engine_side.setup_engine, rank, n, "local", threads, None, False
            )
        return sub

    return take


# -- each lecture runs once: on the emulated room's cluster where there is a room -----------------
ROOM_LECTURES = "tests/kit/room/test_room_lectures.py::test_lecture_runs_on_the_rooms_cluster["


# -- the longest files first: the two workers finish together -------------------------------------
#: The files that take a worker longest (seconds summed over their tests, fresh clone, quiet:
#: ``docs/measurements.md``), longest first. ``./kit test`` passes ``--no-loadscope-reorder``, so
#: xdist hands files out in collection order (by default it sorts them by their number of tests,
#: which put the room's lectures, 14 tests and 10-13 minutes, among the last to start: the
#: long pole). Started first, the longest file runs beside all the short ones on the other worker.
LONGEST_FIRST = (  # seconds: a fresh clone's --durations, summed per file (2026-11-29)
    "tests/kit/room/test_room_lectures.py",  # 485
    "tests/grader/assignments/test_grading_a5_to_a8.py",  # 155
    "tests/grader/selftest/test_grading_attacks.py",  # 140
    "tests/lib/comm/test_comm_backends.py",  # 138
    "tests/kit/lab/test_slurm.py",  # 112
    "tests/grader/pipeline/test_grading.py",  # 112
    "tests/kit/room/test_browser.py",  # 108 alone (lecture 9 in the room, lecture 0 once)
    "tests/grader/assignments/test_grading_a2.py",  # 74
    "tests/kit/room/test_room_seats.py",  # 70
    "tests/grader/assignments/test_grading_a3.py",  # 60
    "tests/lib/cluster/test_mpi_recovery.py",  # 55
    "tests/grader/sandbox/test_grading_poisoner.py",  # 54
    "tests/grader/sandbox/test_grading_wire.py",  # 51
    "tests/kit/lab/test_lab_seats.py",  # 44
    "tests/lib/cluster/test_cluster.py",  # 42
    "tests/grader/assignments/test_grading_a4.py",  # 37
    "tests/kit/room/test_room_lab.py",  # 32
)


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """Return ``items`` with the files of :data:`LONGEST_FIRST` first, in its order; stable."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    return sorted(items, key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.hookimpl(trylast=True)  # after ``-m`` and ``-k`` have deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the longest files first; deselect a lecture's local run where the room's test runs it.

    ``tests/kit/room/test_room_lectures.py`` runs every lecture that starts engines under nbval,
    top to bottom, connected to the room (the same cells, the same checks), so running it a second
    time on local engines only repeats its cells. Where this machine cannot host a room (not root,
    no ``ip``), or ``-m "not room"`` deselected the room's test, the lectures run locally as before.
    """
    from course_kit.room.build import missing_prerequisite

    _only_the_translations_run_in_ci(config, items)
    items[:] = longest_first(items)
    in_the_room = {
        i.nodeid[len(ROOM_LECTURES) : -1] for i in items if i.nodeid.startswith(ROOM_LECTURES)
    }
    if not in_the_room or missing_prerequisite() is not None:
        return
    kept, left = [], []
    for item in items:
        is_lecture = item.nodeid.startswith("notebooks/") and item.path.stem in in_the_room
        (left if is_lecture else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


def _only_the_translations_run_in_ci(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the translated editions (``notebooks/<lang>/``) that are not stored executed.

    Their code is the English notebook's, byte for byte (tests/kit/i18n), so running every one
    would only repeat the English runs; the editions in ``RUN_IN_CI`` run, with Russian messages.
    """
    from course_kit.i18n.editions import RUN_IN_CI

    def skipped(item: pytest.Item) -> bool:
        parts = item.nodeid.split("::")[0].split("/")
        lang = parts[1] if len(parts) > 2 and parts[0] == "notebooks" else None
        return lang in RUN_IN_CI and item.path.stem not in RUN_IN_CI[lang]

    left = [item for item in items if skipped(item)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if not skipped(item)]


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's reporter
    """Name the lectures that ran only on the room's cluster (their local run was deselected)."""
    from course_kit.room.build import missing_prerequisite

    reports = [r for rs in terminalreporter.stats.values() for r in rs if hasattr(r, "when")]
    ran = sorted(
        {r.nodeid[len(ROOM_LECTURES) : -1] for r in reports if r.nodeid.startswith(ROOM_LECTURES)}
    )
    if ran and missing_prerequisite() is None:
        terminalreporter.write_line(
            f"{len(ran)} lectures ran once, on the emulated room's cluster "
            f"(tests/kit/room/test_room_lectures.py), not again on local engines: {', '.join(ran)}"
        )
