"""The chaos test on either data plane: the ovs victims, and how br0's state is judged."""

from __future__ import annotations

import random
from ipaddress import IPv4Address, IPv4Interface

from podnet.cluster.state import ClusterState, NodeRecord
from podnet.dataplane.interface import PodNetwork
from podnet.dataplane.ovs.ovsdb import Port
from podnet.dataplane.ovs.ovspods import identity
from podnet.dataplane.wiring import host_veth_name
from podnet.testing.chaoskill import Victim, pick, plane_kinds, victims
from podnet.testing.planeview import _port_fault, diff_problems


def cluster(dataplane: str) -> ClusterState:
    nodes = {n: NodeRecord(n, i, f"ns{i}", f"10.0.0.{i}") for i, n in enumerate(["n1", "n2"])}
    return ClusterState(nodes=nodes, dataplane=dataplane)


def test_ovs_daemons_are_victims_on_ovs_only() -> None:
    assert plane_kinds("linux") == ()
    assert not [v for v in victims(cluster("linux")) if v.kind in plane_kinds("ovs")]
    found = [str(v) for v in victims(cluster("ovs")) if v.kind in plane_kinds("ovs")]
    assert found == [
        "ovsdb-server of n1",
        "ovsdb-server of n2",
        "ovs-vswitchd of n1",
        "ovs-vswitchd of n2",
    ]
    kinds = ("agent", "master", "etcd", *plane_kinds("ovs"))
    picked = {pick(random.Random(seed), cluster("ovs"), kinds).kind for seed in range(80)}
    assert picked == set(kinds)
    assert Victim("ovs-vswitchd", "n2") in victims(cluster("ovs"))


def test_diff_flows_output_names_stale_and_missing_flows() -> None:
    diff = (
        "-priority=20,arp cookie=0x2 actions=drop\n"
        "+priority=20,arp cookie=0x2 actions=NORMAL\n"
        "+table=70, priority=100,ip,nw_dst=10.128.0.5 cookie=0x3 actions=drop\n"
    )
    assert diff_problems("node1", diff) == [
        "node1 br0: 1 stale flow(s) ['priority=20,arp cookie=0x2 actions=drop']",
        "node1 br0: 2 missing flow(s) ['priority=20,arp cookie=0x2 actions=NORMAL', "
        "'table=70, priority=100,ip,nw_dst=10.128.0.5 cookie=0x3 actions=drop']",
    ]
    assert diff_problems("node1", "") == []


def test_a_pod_port_is_whole_with_an_ofport_and_its_own_pods_identity() -> None:
    address, gateway = IPv4Interface("10.128.0.5/23"), IPv4Address("10.128.0.1")
    ids = identity(PodNetwork("c1", "/run/netns/x", "eth0", address, gateway, 1450))
    name = host_veth_name("c1", "eth0")
    assert _port_fault(Port(name, "", 3, ids)) == ""
    assert _port_fault(Port(name, "", -1, ids)) == " (ofport -1)"
    assert _port_fault(Port(name, "", 3, {})) == " (no pod identity)"
    other = host_veth_name("c2", "eth0")
    assert _port_fault(Port(other, "", 3, ids)) == " (identity of c1/eth0)"
