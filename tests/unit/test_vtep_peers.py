"""Who may send a node VXLAN (``podnet.dataplane.vteppeers``) and what linux makes of it:
the peer sets, and the permanent neighbour entries on the underlay (pure)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from podnet.dataplane.interface import NodeNetwork, RemoteNode
from podnet.dataplane.linux import desired
from podnet.dataplane.linux.desired import NeighEntry, remote_entries
from podnet.dataplane.vteppeers import VtepPeer, ip_only, unpublished, vtep_peers, with_mac
from podnet.model.underlaymac import annotated_mac, mac_problem, normal_mac

IP = IPv4Address
UNDERLAY = [IPv4Network("203.0.113.0/24")]
MAC2, MAC3 = "02:00:00:00:00:02", "02:00:00:00:00:03"


def node(tunnel: str = "vxlan") -> NodeNetwork:
    return NodeNetwork(
        "node-1",
        IP("203.0.113.1"),
        IPv4Network("10.128.0.0/23"),
        (IPv4Network("10.128.0.0/14"),),
        IPv4Network("172.30.0.0/16"),
        1450,
        tunnel,  # type: ignore[arg-type]
    )


def remote(i: int, mac: str | None, ip: str | None = None) -> RemoteNode:
    address = IP(ip or f"203.0.113.{i}")
    return RemoteNode(f"node-{i}", address, IPv4Network(f"10.128.{2 * (i - 1)}.0/23"), mac)


def test_a_peer_s_mac_is_checked_when_published_and_on_the_underlay_s_subnet() -> None:
    remotes = [remote(2, MAC2), remote(3, None), remote(4, MAC3, "192.0.2.4"), remote(1, MAC2)]
    peers = vtep_peers(node(), remotes, UNDERLAY)
    assert with_mac(peers) == [VtepPeer(IP("203.0.113.2"), MAC2)]
    # no MAC published (an older agent), or behind a router (the outer MAC is the
    # router's): by address alone; this node itself is no peer
    assert ip_only(peers) == [VtepPeer(IP("192.0.2.4")), VtepPeer(IP("203.0.113.3"))]
    assert unpublished(remotes) == ["node-3"]
    assert vtep_peers(node("host-gw"), remotes, UNDERLAY) == frozenset()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("02:00:00:00:00:0a", None),
        ("02:00:00:00:00:0A", "not a MAC address"),
        ("01:00:5e:00:00:01", "multicast"),
        ("00:00:00:00:00:00", "zero"),
        ("02:00:00:00:00", "not a MAC address"),
        (7, "not a MAC address"),
    ],
)
def test_mac_problem_says_why(text: object, problem: str | None) -> None:
    found = mac_problem(text)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_normal_mac_lowers_and_refuses() -> None:
    assert normal_mac(" 02:AB:00:00:00:01 ") == "02:ab:00:00:00:01"
    assert normal_mac("ff:ff:ff:ff:ff:ff") is None
    assert normal_mac(None) is None
    node = {"metadata": {"annotations": {"podnet.io/underlay-mac": "02:AB:00:00:00:01"}}}
    assert annotated_mac(node) == "02:ab:00:00:00:01"
    assert annotated_mac({"metadata": {}}) is None


def test_each_checked_peer_gets_a_permanent_neighbour_on_the_underlay() -> None:
    remotes = [remote(2, MAC2), remote(3, None)]
    peers = vtep_peers(node(), remotes, UNDERLAY)
    want = remote_entries(node(), remotes, "eth0", peers)
    on_underlay = {n for n in want.neighbours if n.dev == "eth0"}
    assert on_underlay == {NeighEntry(IP("203.0.113.2"), MAC2, "eth0")}
    # node 2 leaves: its entry is deleted by its exact address, nothing else moves
    gone = remote_entries(
        node(), [remote(3, None)], "eth0", vtep_peers(node(), [remote(3, None)], UNDERLAY)
    )
    changes = desired.remote_changes(gone, want)
    assert NeighEntry(IP("203.0.113.2"), MAC2, "eth0") in changes.neighbours.delete
    assert not changes.neighbours.add and not changes.neighbours.replace
    # node 2's MAC changes (a new NIC): its entry is replaced in place
    moved = [remote(2, MAC3), remote(3, None)]
    changes = desired.remote_changes(
        remote_entries(node(), moved, "eth0", vtep_peers(node(), moved, UNDERLAY)), want
    )
    assert changes.neighbours.replace == [NeighEntry(IP("203.0.113.2"), MAC3, "eth0")]
