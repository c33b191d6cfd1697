"""gloo across a room of PCs cloned from one disk image, with no settings.

Every PC of this emulated room reports the same host name (which its /etc/hosts maps to
127.0.1.1, as on a cloned Debian PC), and each PC's interface has another name (``eth0``,
``enp3s0``, ``eno1``), so neither the host names nor one ``ifname`` can place the ranks.
``setup_communicators(cluster, "gloo")`` must still work with no ``ifname``, and a rendezvous
that cannot complete must fail within seconds, naming the PC and the fix. Uses ``Lab`` of
``test_room.py`` (the instructor guide's lab steps). Deselect with ``-m "not room"``.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import numpy as np
import pytest
from test_room import PCS, Lab, _allreduce_on_engine

from course_kit.room.build import PC, room_unavailable_reason
from course_lib.comm import RendezvousError, setup_communicators

pytestmark = [pytest.mark.room, pytest.mark.slow, pytest.mark.timeout(300)]

HOSTNAME = "labpc"
IFNAMES = ("eth0", "enp3s0", "eno1")  # pc1, pc2, pc3


@pytest.fixture(scope="module")
def cloned_lab(tmp_path_factory: pytest.TempPathFactory):
    """Yield the instructor's cluster: four engines on three cloned PCs (two on one PC)."""
    reason = room_unavailable_reason()
    if reason is not None:
        pytest.skip(f"no emulated room here: {reason}")
    lab = Lab(tmp_path_factory.mktemp("cloned"), hostname=HOSTNAME, ifnames=IFNAMES)
    try:
        lab.start()
    except BaseException as exc:
        log = lab.engine_log()
        lab.close()
        raise RuntimeError(f"the lab cluster did not start: {exc}\nengine logs:\n{log}") from exc
    yield lab
    lab.close()


def _where() -> dict[str, Any]:
    """Run on an engine: its host name, its PC's address and interface, and gloo's interface."""
    import os
    import socket

    import psutil

    nics = {
        name: a.address
        for name, entries in psutil.net_if_addrs().items()
        for a in entries
        if a.family == socket.AF_INET and name != "lo"
    }
    return {
        "host": socket.gethostname(),
        "nics": nics,
        "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    }


def _pc_of_rank(lab: Lab) -> list[PC]:
    """Return the room PC each rank runs on (found by its address, not its host name)."""
    by_ip = {pc.ip: pc for pc in lab.room.pcs}
    where = lab.cluster.run(_where, timeout=60)
    return [by_ip[next(iter(info["nics"].values()))] for info in where]


def test_cloned_pcs_share_a_host_name_and_differ_in_interface_names(cloned_lab: Lab) -> None:
    where = cloned_lab.cluster.run(_where, timeout=60)
    assert [info["host"] for info in where] == [HOSTNAME] * len(PCS)
    by_ip = {pc.ip: pc for pc in cloned_lab.room.pcs}
    for info in where:
        ((name, ip),) = info["nics"].items()  # one interface besides loopback
        assert name == by_ip[ip].ifname, info
    assert sorted({next(iter(info["nics"])) for info in where}) == sorted(IFNAMES)
    # The shared name resolves to loopback on every PC: what gloo would bind to unguided.
    pc = cloned_lab.room.pcs[1]
    done = cloned_lab.room.run(pc, ["getent", "hosts", HOSTNAME], timeout=30)
    assert done.stdout.split()[0] == "127.0.1.1", done.stdout + done.stderr


def test_gloo_needs_no_ifname_on_cloned_pcs(cloned_lab: Lab) -> None:
    cluster = cloned_lab.cluster
    reprs = setup_communicators(cluster, backend="gloo", timeout=30)
    assert len(reprs) == len(PCS) and all("gloo" in r for r in reprs), reprs
    n = 10_007
    results = cluster.run(_allreduce_on_engine, n, timeout=60)
    expected = sum(
        np.random.default_rng(r).standard_normal(n).astype(np.float32).astype(np.float64)
        for r in range(len(PCS))
    )  # the single-process baseline
    for res in results:
        np.testing.assert_allclose(res["builtin"], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(res["ring"], expected, rtol=1e-5, atol=1e-5)
        assert res["ints_equal"]
    # Each rank bound gloo to its own PC's interface, found from the route towards rank 0 ...
    pcs = _pc_of_rank(cloned_lab)
    where = cluster.run(_where, timeout=60)
    assert [info["gloo_ifname"] for info in where] == [pc.ifname for pc in pcs]
    # ... and talked to the ranks on the other PCs over the room's links, not loopback.
    for res, pc in zip(results, pcs, strict=True):
        others = {other.ip for other in pcs if other != pc}
        assert others <= set(res["peers"]), (pc, res["peers"])


def test_a_pc_that_cannot_reach_rank_0_is_named_within_seconds(cloned_lab: Lab) -> None:
    cluster = cloned_lab.cluster
    pcs = _pc_of_rank(cloned_lab)
    cut = next(pc for pc in pcs if pc != pcs[0])  # a PC without rank 0
    # No route from that PC to rank 0's PC (as from a PC on another subnet); the controller's
    # address stays reachable, so its engine still answers the notebook.
    unreachable = [
        "ip",
        "netns",
        "exec",
        cut.netns,
        "ip",
        "route",
        "{}",
        "unreachable",
        f"{pcs[0].ip}/32",
    ]
    subprocess.run([w.format("add") for w in unreachable], check=True, timeout=30)
    timeout = 120.0  # gloo's own wait; the probe must answer long before it
    try:
        start = time.monotonic()
        with pytest.raises(RendezvousError) as caught:
            setup_communicators(cluster, backend="gloo", timeout=timeout)
        elapsed = time.monotonic() - start
    finally:
        subprocess.run([w.format("del") for w in unreachable], check=True, timeout=30)
    message = str(caught.value)
    print(f"\nrendezvous refused after {elapsed:.1f} s (gloo's timeout {timeout:g} s):\n{message}")
    assert elapsed < timeout  # the probe answered, not gloo's timeout
    assert f"{cut.ip} on {cut.ifname}" in message  # the PC that cannot reach rank 0
    assert pcs[0].ip in message and "Fix:" in message and "firewall" in message
    named = [line for line in message.splitlines() if line.startswith("  PC ")]
    assert named and all(cut.ip in line for line in named), named  # that PC and no other
    # With the route back, the same call works: nothing of the failed attempt is left over.
    setup_communicators(cluster, backend="gloo", timeout=30)
    assert all(res["ints_equal"] for res in cluster.run(_allreduce_on_engine, 100, timeout=60))


def test_a_master_addr_not_on_rank_0s_pc_is_refused_with_advice(cloned_lab: Lab) -> None:
    bogus = cloned_lab.room.instructor_ip  # the instructor's PC: no engine here
    with pytest.raises(ValueError, match="not an address of rank 0's PC") as caught:
        setup_communicators(cloned_lab.cluster, backend="gloo", master_addr=bogus, timeout=30)
    assert "leave master_addr unset" in str(caught.value)
    with pytest.raises(ValueError, match="no IPv4 interface named 'wlan0'"):
        setup_communicators(cloned_lab.cluster, backend="gloo", ifname="wlan0", timeout=30)
