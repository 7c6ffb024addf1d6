"""How a node's underlay MAC reaches its peers: the node writes it on its own Node
(NodeRestriction checks it), the HostSubnet controller copies a usable one to the node's
HostSubnet, the peers' agents read it into ``RemoteNode.mac`` (pure parts)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network
from typing import Any

from podnet.agent.remotes import remote_nodes
from podnet.agent.underlaymac import Interface, choose_mac
from podnet.api.authorizer import RequestAttributes, authorize
from podnet.api.identity import User
from podnet.controllers.objects import (
    host_matches,
    hostsubnet_object,
    node_underlay_mac,
    with_host,
)
from podnet.model.kinds import HOST_SUBNET, NODE
from podnet.model.underlaymac import UNDERLAY_MAC_ANNOTATION

N1 = User("system:node:n1", ("system:nodes",))
MAC = "02:00:00:00:00:01"
IP = IPv4Address("203.0.113.1")


def node(name: str, mac: object | None) -> dict[str, Any]:
    notes = {} if mac is None else {UNDERLAY_MAC_ANNOTATION: mac}
    return {"metadata": {"name": name, "annotations": notes}}


def patch(user: User, name: str, new: dict[str, Any], old: dict[str, Any]) -> str | None:
    return authorize(user, RequestAttributes("patch", NODE, None, name, None, new, old))


def test_a_node_publishes_a_usable_mac_on_its_own_node_only() -> None:
    assert patch(N1, "n1", node("n1", MAC), node("n1", None)) is None
    refused = patch(N1, "n1", node("n1", "ff:ff:ff:ff:ff:ff"), node("n1", None))
    assert refused is not None and "multicast" in refused
    refused = patch(N1, "n1", node("n1", "not-a-mac"), node("n1", MAC))
    assert refused is not None and UNDERLAY_MAC_ANNOTATION in refused
    assert patch(N1, "n2", node("n2", MAC), node("n2", None)) is not None
    # nor may it write any HostSubnet, where the master copies the MAC to
    hostsubnet = hostsubnet_object("n2", "203.0.113.2", IPv4Network("10.128.2.0/23"), "u2", MAC)
    update = RequestAttributes("update", HOST_SUBNET, None, "n2", None, hostsubnet, hostsubnet)
    assert authorize(N1, update) is not None


def test_the_controller_copies_a_usable_mac_and_removes_a_gone_one() -> None:
    assert node_underlay_mac(node("n1", "02:AA:00:00:00:01")) == "02:aa:00:00:00:01"
    assert node_underlay_mac(node("n1", "01:00:5e:00:00:01")) is None
    hs = hostsubnet_object("n1", str(IP), IPv4Network("10.128.0.0/23"), "u1", MAC)
    assert hs["metadata"]["annotations"][UNDERLAY_MAC_ANNOTATION] == MAC
    assert host_matches(hs, str(IP), "u1", MAC)
    assert with_host(hs, str(IP), "u1", MAC) is None  # nothing to write
    other = "02:00:00:00:00:09"
    assert with_host(hs, str(IP), "u1", other) is hs
    assert hs["metadata"]["annotations"][UNDERLAY_MAC_ANNOTATION] == other
    assert with_host(hs, str(IP), "u1", None) is hs
    assert UNDERLAY_MAC_ANNOTATION not in hs["metadata"]["annotations"]


def test_peers_read_the_mac_from_the_hostsubnet() -> None:
    with_mac = hostsubnet_object("n2", "203.0.113.2", IPv4Network("10.128.2.0/23"), "u2", MAC)
    without = hostsubnet_object("n3", "203.0.113.3", IPv4Network("10.128.4.0/23"), "u3")
    bad = hostsubnet_object("n4", "203.0.113.4", IPv4Network("10.128.6.0/23"), "u4", "nonsense")
    remotes = remote_nodes([with_mac, without, bad], "n1")
    assert [(r.name, r.mac) for r in remotes] == [("n2", MAC), ("n3", None), ("n4", None)]


def test_the_agent_publishes_the_mac_of_the_interface_holding_its_ip() -> None:
    interfaces = [
        Interface("br-phy", "02:00:00:00:00:0b", frozenset({IP})),
        Interface("eth0", "02:00:00:00:00:0E", frozenset({IP})),
        Interface("eth1", "02:00:00:00:00:0f", frozenset({IPv4Address("192.0.2.1")})),
        Interface("lo", "00:00:00:00:00:00", frozenset({IPv4Address("127.0.0.1")})),
    ]
    assert choose_mac(interfaces, IP) == "02:00:00:00:00:0e"
    assert choose_mac(interfaces, IPv4Address("192.0.2.1")) == "02:00:00:00:00:0f"
    assert choose_mac(interfaces, IPv4Address("198.51.100.1")) is None
    assert choose_mac(interfaces, IPv4Address("127.0.0.1")) is None  # zero MAC
