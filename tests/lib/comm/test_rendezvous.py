"""Where gloo's ranks meet: which engines share a PC, rank 0's address, the reachability probe.

The room tests (``test_room_gloo.py``) run all of it across emulated PCs; these pin the rules
on descriptions of PCs as ``describe_pc`` returns them.
"""

from __future__ import annotations

import socket

import pytest

from course_lib.comm.rendezvous import (
    choose_master_address,
    describe_pc,
    group_by_pc,
    interface_towards,
    probe,
)

LAB = [["eth0", "10.0.0.2", "255.255.255.0"], ["docker0", "172.17.0.1", "255.255.0.0"]]


def _pc(host: str, boot: str | None, netns: int | None, *addrs: tuple[str, str]) -> dict:
    interfaces = [[name, addr, "255.255.255.0"] for name, addr in addrs]
    return {"host": host, "boot_id": boot, "netns": netns, "interfaces": interfaces}


def test_engines_share_a_pc_by_network_stack_and_addresses_not_host_name() -> None:
    a = _pc("labpc", "boot-a", 1, ("eth0", "10.0.0.2"), ("docker0", "172.17.0.1"))
    b = _pc("labpc", "boot-b", 1, ("enp3s0", "10.0.0.3"), ("docker0", "172.17.0.1"))
    # Cloned PCs: one host name and docker's same address, yet two PCs (ranks 0, 1 | 2, 3).
    assert group_by_pc([a, a, b, b]) == [0, 0, 1, 1]
    assert group_by_pc([b, a, b]) == [0, 1, 0]
    # One kernel, two network namespaces (the emulated room): two PCs.
    c = dict(a, netns=2, interfaces=[["eth0", "10.0.0.4", "255.255.255.0"]])
    assert group_by_pc([a, c]) == [0, 1]
    # Off Linux (no boot id, no namespace) the addresses alone decide.
    w1 = _pc("LAB-PC", None, None, ("Ethernet", "10.0.0.5"))
    w2 = _pc("LAB-PC", None, None, ("Ethernet 2", "10.0.0.6"))
    assert group_by_pc([w1, w1, w2]) == [0, 0, 1]
    assert group_by_pc([]) == []


def test_engines_of_this_process_tree_are_one_pc() -> None:
    here = describe_pc()
    assert here["host"] == socket.gethostname()
    assert all(not addr.startswith("127.") for _, addr, _ in here["interfaces"])
    assert group_by_pc([here, describe_pc()]) == [0, 0]


def test_rank_0_announces_its_address_on_the_subnet_it_shares_with_the_others() -> None:
    assert choose_master_address(LAB, []) == "127.0.0.1"  # every rank on this PC
    # The peer's docker address is rank 0's own too: the lab subnet's address wins.
    assert choose_master_address(LAB, ["172.17.0.1", "10.0.0.7"]) == "10.0.0.2"
    with pytest.raises(ValueError, match="only addresses rank 0's PC has"):
        choose_master_address(LAB, ["172.17.0.1"])
    with pytest.raises(ValueError, match=r"no IPv4 interface named 'wlan9'.*eth0 \(10\.0\.0\.2\)"):
        choose_master_address(LAB, ["10.0.0.7"], ifname="wlan9")


def test_a_rank_finds_its_interface_towards_rank_0() -> None:
    here = describe_pc()["interfaces"]
    assert interface_towards("127.0.0.1", here) is None  # one PC: gloo's default
    for name, addr, _ in here:  # towards an address of this PC: the interface that holds it
        assert interface_towards(addr, here) == name


def test_the_probe_says_why_a_port_cannot_be_reached() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert probe("127.0.0.1", port, 5.0) is None
    assert "refused" in probe("127.0.0.1", port, 5.0).lower()  # closed now
