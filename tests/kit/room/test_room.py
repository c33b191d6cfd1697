"""The lab path on real processes: an instructor's cluster spread over an emulated room of PCs.

Each PC is a network namespace with its own host name and a 1 Gbit/s shaped link to a bridge
(see ``room.py``); the instructor's PC is this machine's root namespace. The steps are the
instructor guide (docs/instructor.md §2, "Start the room's cluster"): ``ipcluster start --profile=lab
--daemonize --ip='*'`` on the instructor's PC (with ``-n 0``: every engine here sits on a lab
PC), ``ipengine --file=.../ipcontroller-engine.json`` on each PC, the doctor, and notebooks
that connect with the client connection file. Deselect with ``-m "not room"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from course_kit.room.build import (
    Room,
    emulated_room,
    leftovers,
    netns_inode,
    room_unavailable_reason,
)
from course_lib.cluster import CourseCluster, connect_cluster, start_cluster
from course_lib.comm.setup import setup_communicators

pytestmark = [
    pytest.mark.room,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent  # ipcluster / ipengine of the venv running the tests
RATE_BYTES = 125e6  # tbf rate of every link: 1 Gbit/s
# Ping-pong over a 1 Gbit/s tbf link gives ~119 MB/s of TCP payload (1448 of every 1514 bytes
# on the wire). No transfer between two PCs can beat the shaped rate (5 % for tbf's burst); a
# floor would only measure how busy the machine is, so tests assert none.
RATE_CEILING = 1.05
PCS = ("pc1", "pc1", "pc2", "pc3")  # where the engines run: two on the first PC, one elsewhere


class Lab:
    """The instructor's running cluster in an emulated room, closed once by :meth:`close`."""

    def __init__(self, workdir: Path, **room_options: Any) -> None:
        self.workdir = workdir
        self.room_options = room_options  # emulated_room's: hostname=, ifnames=
        self.ipythondir = workdir / "instructor"
        self.security = self.ipythondir / "profile_lab" / "security"
        self.stack = contextlib.ExitStack()
        self.room: Room | None = None
        self.cluster: CourseCluster | None = None
        self.controller_pid: int | None = None
        self.engine_procs: list[subprocess.Popen] = []
        self.hosts: dict[str, str] = {}  # PC label ("pc1") -> its host name

    def instructor_env(self) -> dict[str, str]:
        """Return the environment of the instructor's shell (its own IPython directory)."""
        return dict(os.environ, IPYTHONDIR=str(self.ipythondir))

    def start(self) -> None:
        """Build the room, start the controller, an engine per entry of ``PCS``, and connect."""
        self.room = self.stack.enter_context(emulated_room(3, **self.room_options))
        pcs = {f"pc{k}": pc for k, pc in enumerate(self.room.pcs, start=1)}
        self.hosts = {label: pc.hostname for label, pc in pcs.items()}
        self._start_controller()
        engine_file = self.security / "ipcontroller-engine.json"
        for i, label in enumerate(PCS):
            # Each PC has its own home: its engine must not share the instructor's profile.
            env = dict(
                os.environ, IPYTHONDIR=str(self.workdir / f"{label}-{i}"), OMP_NUM_THREADS="1"
            )
            log = open(self.workdir / f"engine{i}.log", "w")  # noqa: SIM115 - kept for the run
            self.stack.callback(log.close)
            proc = self.room.popen(
                pcs[label],
                [str(BIN / "ipengine"), f"--file={engine_file}"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.engine_procs.append(proc)
        self.cluster = connect_cluster(
            connection_file=str(self.security / "ipcontroller-client.json"),
            n=len(PCS),
            timeout=90,
        )
        self.stack.callback(self.cluster.stop)

    def _start_controller(self) -> None:
        argv = [
            str(BIN / "ipcluster"),
            "start",
            "--profile=lab",
            "-n",
            "0",
            "--daemonize",
            "--ip=*",
        ]
        done = subprocess.run(
            argv, env=self.instructor_env(), capture_output=True, text=True, timeout=60
        )
        self.stack.callback(self._stop_controller)
        assert done.returncode == 0, done.stderr[-2000:]
        state = json.loads((self.security / "cluster-.json").read_text())
        self.controller_pid = state["controller"]["state"]["pid"]  # to check it is gone later
        assert (self.security / "ipcontroller-engine.json").is_file(), done.stderr[-2000:]

    def _stop_controller(self) -> None:
        subprocess.run(
            [str(BIN / "ipcluster"), "stop", "--profile=lab"],
            env=self.instructor_env(),
            capture_output=True,
            timeout=60,
        )
        if self.controller_pid is not None and not _gone(self.controller_pid, within=10):
            os.kill(self.controller_pid, 9)  # ours: started by ipcluster start above

    def engine_log(self) -> str:
        """Return the tail of every engine's log, for failure messages."""
        return "\n".join(p.read_text()[-1500:] for p in sorted(self.workdir.glob("engine*.log")))

    def close(self) -> None:
        """Close the client, stop the controller, kill the engines and remove the room."""
        self.stack.close()


def _gone(pid: int, within: float = 0.0) -> bool:
    """Return True when ``pid`` has exited (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def _needs_a_room() -> None:
    # Asked here, not in a skipif at import: engines import this module to find the functions
    # they run, and must not build a probe room each; nor should a deselected run build one.
    reason = room_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    """Yield the instructor's cluster on four engines in three emulated PCs."""
    reason = room_unavailable_reason()  # module fixtures are set up before autouse ones
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")
    lab = Lab(tmp_path_factory.mktemp("room"))
    try:
        lab.start()
    except BaseException as exc:
        log = lab.engine_log()
        lab.close()
        raise RuntimeError(f"the lab cluster did not start: {exc}\nengine logs:\n{log}") from exc
    yield lab
    lab.close()


def _run(lab: Lab, fn: Callable[..., Any], *args: Any, timeout: float = 60.0) -> list[Any]:
    assert lab.cluster is not None
    return lab.cluster.run(fn, *args, timeout=timeout)


def _where() -> dict[str, Any]:
    """Run on an engine: say which PC it is on (host name, network namespace, addresses)."""
    import os
    import socket

    import psutil

    addrs = sorted(
        a.address
        for name, entries in psutil.net_if_addrs().items()
        for a in entries
        if a.family == socket.AF_INET and name != "lo"
    )
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "ipv4": addrs,
    }


def _by_rank(lab: Lab) -> list[dict[str, Any]]:
    return _run(lab, _where)


def test_every_engine_registers_and_the_doctor_is_happy(lab: Lab) -> None:
    cluster = lab.cluster
    assert cluster.world_size == len(PCS)
    assert cluster.view.pull(["rank", "world_size"]) == [[r, len(PCS)] for r in range(len(PCS))]
    report = cluster.doctor(timeout=30)
    assert report.ok, str(report)
    assert len(report.rows) == len(PCS)
    hosts = sorted(row["host"] for row in report.rows)
    assert hosts == sorted(lab.hosts[label] for label in PCS), str(report)
    assert all(row["status"] == "ok" for row in report.rows)


def test_instructor_doctor_command_lists_every_pc(lab: Lab) -> None:
    # The instructor guide's `./kit doctor --profile lab` runs exactly this after setting up the venv.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "course_kit.jobs.cluster",
            "doctor",
            "--profile",
            "lab",
            "--engines",
            "4",
            # A busy engine is the doctor's own test (test_doctor.py); here every engine must be
            # listed, and at a load of 15 on 2 cores a ping through the room took over 5 s.
            "--timeout",
            "60",
        ],
        env=lab.instructor_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "OK: every engine answered" in done.stdout
    for host in lab.hosts.values():
        assert host in done.stdout


def test_engines_live_on_different_pcs(lab: Lab) -> None:
    where = _by_rank(lab)
    ip_of = {pc.hostname: pc.ip for pc in lab.room.pcs}
    started = {proc.pid for proc in lab.engine_procs}
    for info in where:
        assert info["ipv4"] == [ip_of[info["host"]]], info  # only its own PC's address
        assert info["pid"] in started, info  # one of the ipengine processes the PCs started
        assert netns_inode(info["pid"]) == info["netns"]  # seen from the instructor's PC too
        assert info["netns"] != netns_inode()  # not in the instructor's namespace
    namespaces = {info["host"]: set() for info in where}
    for info in where:
        namespaces[info["host"]].add(info["netns"])
    assert all(len(inodes) == 1 for inodes in namespaces.values()), namespaces  # one per PC
    assert len({next(iter(inodes)) for inodes in namespaces.values()}) == 3, namespaces


def test_a_student_notebook_connects_and_leaves_the_cluster_running(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COURSE_CLUSTER_FILE", str(lab.security / "ipcontroller-client.json"))
    monkeypatch.setenv("COURSE_CLUSTER_ENGINES", str(len(PCS)))
    with start_cluster(timeout=60) as student:  # what every lecture notebook calls
        assert student.kind == "connect"
        assert student.world_size == len(PCS)
        hosts = sorted(student.view.apply_sync(socket.gethostname))
    assert hosts == sorted(lab.hosts[label] for label in PCS)
    # Leaving the `with` closes the student's client only: the instructor's engines stay up.
    assert all(proc.poll() is None for proc in lab.engine_procs), lab.engine_log()
    assert lab.cluster.view.pull("world_size") == [len(PCS)] * len(PCS)


def _allreduce_on_engine(n: int) -> dict[str, Any]:
    """Run on an engine: ring allreduce and gloo's own on the same inputs; report both."""
    import numpy as np
    import psutil
    from IPython import get_ipython

    from course_lib.collectives import ring_allreduce

    user = get_ipython().user_ns
    comm, rank = user["comm"], user["rank"]
    x = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    ints = np.random.default_rng(100 + rank).integers(-1000, 1000, n).astype(np.float32)
    ring, builtin = ring_allreduce(comm, x.copy()), comm.allreduce(x.copy())
    ring_ints, builtin_ints = ring_allreduce(comm, ints.copy()), comm.allreduce(ints.copy())
    peers = {c.raddr.ip for c in psutil.Process().net_connections("tcp") if c.raddr and c.status}
    return {
        "rank": rank,
        "ring": ring,
        "builtin": builtin,
        "ints_equal": bool(np.array_equal(ring_ints, builtin_ints)),
        "peers": sorted(peers),
    }


@pytest.mark.parametrize("ifname", [None, "eth0"], ids=["address-from-host-names", "ifname"])
def test_gloo_ring_allreduce_across_pcs_equals_the_builtin(lab: Lab, ifname: str | None) -> None:
    reprs = setup_communicators(lab.cluster, backend="gloo", ifname=ifname, timeout=30)
    assert len(reprs) == len(PCS) and all("gloo" in r for r in reprs), reprs
    n = 100_003  # not divisible by 4: the ring's chunks differ in size
    results = _run(lab, _allreduce_on_engine, n)
    expected = sum(
        np.random.default_rng(r).standard_normal(n).astype(np.float32).astype(np.float64)
        for r in range(len(PCS))
    )  # the single-process baseline
    for res in results:
        np.testing.assert_allclose(res["ring"], res["builtin"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(res["ring"], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(res["ring"], results[0]["ring"])  # every rank the same
        assert res["ints_equal"]  # exact sums: ring and built-in agree bit for bit
    # The ranks really talked over the room's links: each one has a connection to every PC.
    where = _by_rank(lab)
    for res, info in zip(results, where, strict=True):
        others = {pc.ip for pc in lab.room.pcs if pc.hostname != info["host"]}
        assert others <= set(res["peers"]), (info["host"], res["peers"])


def _ping_pong_on_engine(pair: tuple[int, int], sizes: list[int]) -> dict[str, Any]:
    """Run on an engine: calibrate the link between ``pair`` with ping-pong."""
    from IPython import get_ipython

    from course_lib.cost_model.alpha_beta import ping_pong

    cal = ping_pong(get_ipython().user_ns["comm"], sizes=sizes, repeats=3, pair=pair)
    return {"times": cal.times, "bandwidth": cal.model.bandwidth, "alpha": cal.model.alpha}


def _shaped_bytes(pc: Any) -> int:
    """Return the bytes the tbf shaper on the switch's side of ``pc``'s link has sent so far."""
    out = subprocess.run(
        ["tc", "-s", "-j", "qdisc", "show", "dev", pc.host_veth],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sum(q.get("bytes", 0) for q in json.loads(out) if q.get("kind") == "tbf")


def test_ping_pong_between_pcs_goes_through_the_shaper(lab: Lab) -> None:
    setup_communicators(lab.cluster, backend="gloo", ifname="eth0", timeout=30)
    hosts = [info["host"] for info in _by_rank(lab)]
    alone = [r for r, h in enumerate(hosts) if hosts.count(h) == 1]  # pc2's and pc3's ranks
    shared = [r for r, h in enumerate(hosts) if hosts.count(h) == 2]  # pc1's two ranks
    pc_of = {pc.hostname: pc for pc in lab.room.pcs}
    receiver, shared_pc = pc_of[hosts[alone[1]]], pc_of[hosts[shared[0]]]
    sizes = [2**16, 2**20, 2**22, 2**23]
    before = _shaped_bytes(receiver)
    across = _run(lab, _ping_pong_on_engine, tuple(alone), sizes)[alone[0]]
    through_link = _shaped_bytes(receiver) - before
    before = _shaped_bytes(shared_pc)
    within = _run(lab, _ping_pong_on_engine, tuple(shared), sizes)[shared[0]]
    through_shared_link = _shaped_bytes(shared_pc) - before
    # Bandwidth from the large messages (size / one-way time), not from the alpha-beta fit:
    # tbf lets a bucket's worth (BURST) through at memory speed, so small messages beat the
    # rate and the fit, which weighs every size alike, lands above it.
    rates = {size: size / t for size, t in zip(sizes, across["times"], strict=True)}
    within_rate = sizes[-1] / within["times"][-1]
    print(
        f"\nping-pong between two PCs: 4 MB {rates[2**22] / 1e6:.1f} MB/s, 8 MB "
        f"{rates[2**23] / 1e6:.1f} MB/s (fit {across['bandwidth'] / 1e6:.1f} MB/s, alpha "
        f"{across['alpha'] * 1e6:.0f} us); inside one PC: 8 MB {within_rate / 1e6:.1f} MB/s; "
        f"tbf rate 125 MB/s; through the shaper: {through_link / 1e6:.1f} MB across, "
        f"{through_shared_link / 1e6:.2f} MB for the pair inside one PC"
    )
    # What the room promises, checked with the shaper's own byte counters, so that a loaded
    # machine (which can only make transfers slower) cannot fail it: every message between two
    # PCs crossed the shaped link, and two engines on one PC talk over its loopback instead
    # (only heartbeats and the like cross its link meanwhile).
    assert through_link >= sum(sizes), (through_link, across)
    assert through_shared_link < sum(sizes) / 4, (through_shared_link, within)
    # Load slows a transfer down but never speeds it up: the shaped rate is a hard ceiling.
    # (The floor is the benchmark's business: ./kit bench room.)
    for size in (2**22, 2**23):
        assert rates[size] <= RATE_CEILING * RATE_BYTES, (size, across)


def _rename_host(name: str) -> str:
    """Run on an engine: change the host name it reports (its own UTS namespace, see room.py)."""
    import socket

    socket.sethostname(name)
    return socket.gethostname()


def _rendezvous_address(hosts: list[str], ifname: str) -> str:
    """Run on rank 0's engine: the address course_lib announces to the other ranks."""
    import torch.distributed  # noqa: F401 - so the gloo set-up's short timeout is not import time

    from course_lib.comm.setup import master_address, rendezvous_peer

    return master_address(rendezvous_peer(hosts), ifname)


def test_gloo_across_pcs_with_cloned_host_names_and_ifname(lab: Lab) -> None:
    # PCs installed from one disk image often share a host name; the interface name given by
    # the instructor must still give rank 0's address on the room's network.
    _run(lab, _rename_host, "labpc")
    try:
        with connect_cluster(
            connection_file=str(lab.security / "ipcontroller-client.json"), n=len(PCS)
        ) as same_names:
            hosts = [same_names.engine_info[eid]["host"] for eid in same_names.ids_by_rank]
            assert hosts == ["labpc"] * len(PCS)
            same_names.run(_rendezvous_address, hosts, "eth0")  # imports torch everywhere
            rank0 = same_names.client[same_names.ids_by_rank[0]]
            ip_of_rank0 = rank0.apply_sync(_where)["ipv4"][0]
            assert rank0.apply_sync(_rendezvous_address, hosts, "eth0") == ip_of_rank0
            setup_communicators(same_names, backend="gloo", ifname="eth0", timeout=10)
            results = same_names.run(_allreduce_on_engine, 1000, timeout=30)
            assert all(res["ints_equal"] for res in results)
    finally:
        _restore_host_names(lab)


def _restore_host_names(lab: Lab) -> None:
    """Give every engine back the host name of its PC (found by its address)."""
    name_of = {pc.ip: pc.hostname for pc in lab.room.pcs}
    for eid in lab.cluster.ids_by_rank:
        ip = lab.cluster.client[eid].apply_sync(_where)["ipv4"][0]
        lab.cluster.client[eid].apply_sync(_rename_host, name_of[ip])
    hosts = sorted(info["host"] for info in _by_rank(lab))
    assert hosts == sorted(lab.hosts[label] for label in PCS)


def test_room_teardown_on_error_leaves_nothing() -> None:
    with pytest.raises(ZeroDivisionError), emulated_room(2) as room:
        sleeper = room.popen(room.pcs[1], ["sleep", "600"])
        names = room.names
        assert leftovers(names) == names
        1 / 0  # noqa: B018 - the body fails; the room must still go
    assert leftovers(names) == []
    assert _gone(sleeper.pid)
    assert not any(Path("/etc/netns", pc.netns).exists() for pc in room.pcs)


def test_lab_teardown_leaves_no_namespace_link_or_process(lab: Lab) -> None:
    # Runs last in this file: it closes the shared lab itself (the fixture's close is then a
    # no-op) and checks that nothing is left behind.
    names = lab.room.names
    pids = [p.pid for p in lab.engine_procs] + [lab.controller_pid]
    lab.close()
    assert leftovers(names) == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(pc.netns in namespaces for pc in lab.room.pcs)
    assert lab.room.tag not in links
    assert all(_gone(pid, within=5) for pid in pids), pids
    assert not any(Path("/etc/netns", pc.netns).exists() for pc in lab.room.pcs)
