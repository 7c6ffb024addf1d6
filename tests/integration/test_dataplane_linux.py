"""The linux data plane against the real kernel, with real traffic, inside namespaces only.

A lab per test: an underlay namespace whose bridge plays the physical network (TEST-NET-2,
198.51.100.0/24), three node namespaces and an outside host on it, and pod namespaces.
Each ``LinuxDataPlane`` is constructed inside its node namespace. Every namespace is
removed by exact name in the finalizer, even when a test fails.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from ipaddress import IPv4Address, IPv4Network

import pytest

from podnet import netns
from podnet.dataplane.interface import DataPlaneError, NodeSetupRefused, PodNetwork, RemoteNode
from podnet.dataplane.linux.desired import host_veth_name, vtep_mac
from podnet.testing.dataplanes import snapshot
from podnet.testing.lab import (
    EXTERNAL_IP,
    Lab,
    assert_spoofing_dropped,
    built_lab,
    ip,
    ping,
    sh,
    tcp_peer_seen,
    up,
)

pytestmark = [pytest.mark.root]  # root, nft and ip are required (tests/conftest.py)


@pytest.fixture
async def lab() -> AsyncIterator[Lab]:
    """Underlay, outside host and three nodes; everything removed afterwards."""
    async with built_lab("pnt") as the_lab:
        yield the_lab


def routes(ns: str) -> str:
    return sh(ns, "ip", "route", "show", "proto", "80")


# --- traffic ---------------------------------------------------------------------------


async def test_vxlan_pods_reach_each_other_and_the_outside(lab: Lab) -> None:
    planes = await up(lab, [1, 2])
    a_ns, a = lab.pod(1, 10, "a")
    _, b = lab.pod(1, 11, "b")
    c_ns, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[1].attach_pod(b)
    await planes[2].attach_pod(c)

    assert ping(a_ns, b.address.ip), "same-node pod to pod"
    assert ping(a_ns, c.address.ip), "cross-node pod to pod over VXLAN"
    assert ping(c_ns, b.address.ip), "cross-node, the other way"
    assert tcp_peer_seen(c_ns, a_ns, a.address.ip) == str(c.address.ip), "no NAT in cluster"
    seen = tcp_peer_seen(a_ns, f"{lab.run}-ext", EXTERNAL_IP)
    assert seen == str(lab.node_ip(1)), "pod traffic to the outside is masqueraded"

    link = sh(lab.node_ns(1), "ip", "-d", "link", "show", "vxlan0")
    assert "vxlan id 1 local 198.51.100.11" in link and "dstport 4789" in link
    assert "nolearning" in link and vtep_mac(lab.node_ip(1)) in link
    assert "vxlan0" not in sh(lab.node_ns(1), "ip", "link", "show", "master", "br0")
    neigh = sh(lab.node_ns(1), "ip", "neigh", "show", "dev", "vxlan0")
    assert f"10.128.2.0 lladdr {vtep_mac(lab.node_ip(2))} PERMANENT" in neigh
    fdb = sh(lab.node_ns(1), "bridge", "fdb", "show", "dev", "vxlan0")
    assert f"{vtep_mac(lab.node_ip(2))} dst {lab.node_ip(2)}" in fdb
    assert "10.128.2.0/23 via 10.128.2.0 dev vxlan0 src 10.128.0.1 onlink" in routes(lab.node_ns(1))
    for i in (1, 2):
        status = await planes[i].check_node(lab.network(i))
        assert status.ok, status.problems


async def test_host_gw_pods_reach_each_other(lab: Lab) -> None:
    planes = await up(lab, [1, 2], tunnel="host-gw")
    a_ns, a = lab.pod(1, 10, "a")
    c_ns, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[2].attach_pod(c)

    assert ping(a_ns, c.address.ip), "cross-node pod to pod over host-gw routes"
    assert tcp_peer_seen(a_ns, c_ns, c.address.ip) == str(a.address.ip)
    assert "10.128.2.0/23 via 198.51.100.12 dev eth0" in routes(lab.node_ns(1))
    assert netns.run(lab.node_ns(1), ["ip", "link", "show", "vxlan0"]).returncode != 0
    assert (await planes[1].check_node(lab.network(1, "host-gw"))).ok


async def test_switching_tunnel_replaces_vxlan_with_host_gw(lab: Lab) -> None:
    planes = await up(lab, [1, 2])
    hostgw = {i: lab.network(i, "host-gw") for i in (1, 2)}
    for i in (1, 2):
        await planes[i].setup_node(hostgw[i])
        await planes[i].sync_remote_nodes(hostgw[i], [lab.remote(3 - i)])
    assert netns.run(lab.node_ns(1), ["ip", "link", "show", "vxlan0"]).returncode != 0
    assert " ".join(routes(lab.node_ns(1)).split()) == (
        "10.128.2.0/23 via 198.51.100.12 dev eth0 src 10.128.0.1 "
        "172.30.0.0/16 dev br0 scope link src 10.128.0.1 linkdown"
    )
    a_ns, a = lab.pod(1, 10, "a")
    _, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[2].attach_pod(c)
    assert ping(a_ns, c.address.ip)


async def test_spoofed_ip_and_mac_are_dropped(lab: Lab) -> None:
    planes = await up(lab, [1])
    a_ns, a = lab.pod(1, 10, "a")
    _, b = lab.pod(1, 11, "b")
    await planes[1].attach_pod(a)
    await planes[1].attach_pod(b)
    assert ping(a_ns, b.address.ip)

    assert_spoofing_dropped(a_ns, a, b)


# --- remote nodes ------------------------------------------------------------------------


async def test_sync_remote_nodes_applies_only_the_difference(lab: Lab) -> None:
    planes = await up(lab, [1])
    node, n1 = lab.network(1), lab.node_ns(1)
    sh(n1, "ip", "route", "add", "192.168.77.0/24", "via", "198.51.100.99")  # not ours
    ip(n1, "neigh add 10.128.99.0 lladdr 0e:00:00:00:00:01 dev vxlan0 nud permanent")
    await planes[1].sync_remote_nodes(node, [lab.remote(2), lab.remote(3)])
    assert "10.128.4.0/23 via 10.128.4.0 dev vxlan0" in routes(n1)

    sh(n1, "ip", "route", "del", "10.128.4.0/23")  # drift
    await planes[1].sync_remote_nodes(node, [lab.remote(2), lab.remote(3)])
    assert "10.128.4.0/23 via 10.128.4.0 dev vxlan0" in routes(n1)

    moved = RemoteNode("node-3", IPv4Address("198.51.100.33"), lab.subnet(3))
    await planes[1].sync_remote_nodes(node, [lab.remote(2), moved])
    fdb = sh(n1, "bridge", "fdb", "show", "dev", "vxlan0")
    assert "dst 198.51.100.33" in fdb and "dst 198.51.100.13" not in fdb

    await planes[1].sync_remote_nodes(node, [lab.remote(2)])
    assert "10.128.4.0" not in routes(n1)
    assert "10.128.4.0" not in sh(n1, "ip", "neigh", "show", "dev", "vxlan0")
    assert "198.51.100.33" not in sh(n1, "bridge", "fdb", "show", "dev", "vxlan0")
    assert "10.128.2.0/23" in routes(n1)
    assert "192.168.77.0/24" in sh(n1, "ip", "route"), "foreign routes are left alone"
    assert "10.128.99.0" in sh(n1, "ip", "neigh", "show", "dev", "vxlan0"), "and neighbours"

    await planes[1].sync_remote_nodes(node, [])
    assert routes(n1).split() == (
        f"{node.service_network} dev br0 scope link src 10.128.0.1 linkdown".split()
    )


async def test_the_service_network_is_routed_onto_the_bridge(lab: Lab) -> None:
    """Without it a node's own connection to a cluster IP is "network unreachable", and a
    pod's packet to a service without endpoints dies in routing before the proxy's
    reject; the route is podnet's like the remote ones, so drift is repaired."""
    planes = await up(lab, [1])
    node, n1 = lab.network(1), lab.node_ns(1)
    service_ip = str(next(node.service_network.hosts()))
    await planes[1].sync_remote_nodes(node, [lab.remote(2)])
    assert "dev br0 src 10.128.0.1" in sh(n1, "ip", "route", "get", service_ip)
    sh(n1, "ip", "route", "del", str(node.service_network))  # drift
    gone = netns.run(n1, ["ip", "route", "get", service_ip], timeout=30)
    assert gone.returncode != 0 or "br0" not in gone.stdout
    await planes[1].sync_remote_nodes(node, [lab.remote(2)])
    assert "dev br0 src 10.128.0.1" in sh(n1, "ip", "route", "get", service_ip)


async def test_host_gw_refuses_a_node_that_is_not_adjacent(lab: Lab) -> None:
    planes = await up(lab, [1], tunnel="host-gw")
    far = RemoteNode("far", IPv4Address("203.0.113.50"), IPv4Network("10.128.8.0/23"))
    with pytest.raises(NodeSetupRefused, match="far"):
        await planes[1].sync_remote_nodes(lab.network(1, "host-gw"), [lab.remote(2), far])
    table = routes(lab.node_ns(1))
    assert "10.128.2.0/23 via 198.51.100.12" in table and "10.128.8.0" not in table


# --- node set-up ------------------------------------------------------------------------


async def test_setup_again_changes_nothing_while_pods_talk(lab: Lab) -> None:
    planes = await up(lab, [1, 2])
    a_ns, a = lab.pod(1, 10, "a")
    _, c = lab.pod(2, 10, "c")
    await planes[1].attach_pod(a)
    await planes[2].attach_pod(c)
    before = snapshot(lab.node_ns(1))
    pinger = subprocess.Popen(
        netns.command(
            a_ns, ["ping", "-n", "-q", "-c", "100", "-i", "0.02", "-W", "1", str(c.address.ip)]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        await planes[1].setup_node(lab.network(1))
        restarted = lab.plane(1)  # a restarted agent: a fresh backend, same kernel state
        assert (await restarted.check_node(lab.network(1))).ok
        await restarted.setup_node(lab.network(1))
        await restarted.sync_remote_nodes(lab.network(1), [lab.remote(2)])
        assert [p.container_id for p in await restarted.attached_pods()] == [a.container_id]
    finally:
        try:
            out, _ = pinger.communicate(timeout=30)
        finally:
            pinger.kill()
    assert " 0% packet loss" in out, out
    assert snapshot(lab.node_ns(1)) == before


BREAKS = {
    "br0 mtu": ("ip", "link", "set", "br0", "mtu", "1400"),
    "gateway address": ("ip", "addr", "del", "10.128.0.1/23", "dev", "br0"),
    "ip_forward": ("sysctl", "-w", "net.ipv4.ip_forward=0"),
    "nft table": ("nft", "delete", "table", "inet", "podnet"),
    "nft rule": ("nft", "flush", "chain", "bridge", "podnet", "from_pod"),
    "vxlan0": ("ip", "link", "del", "vxlan0"),
    "version note": ("ip", "link", "set", "br0", "alias", "something else"),
}


async def test_check_node_finds_each_break_and_setup_repairs_it(lab: Lab) -> None:
    planes = await up(lab, [1])
    node = lab.network(1)
    _, a = lab.pod(1, 10, "a")
    await planes[1].attach_pod(a)
    assert (await planes[1].check_node(node)).ok
    for what, argv in BREAKS.items():
        sh(lab.node_ns(1), *argv)
        status = await planes[1].check_node(node)
        assert not status.ok, what
        await planes[1].setup_node(node)
        status = await planes[1].check_node(node)
        assert status.ok, (what, status.problems)
    element = f'"{host_veth_name(a.container_id, "eth0")}" . {a.mac} . {a.address.ip}'
    sh(
        lab.node_ns(1),
        "nft",
        "delete",
        "element",
        "bridge",
        "podnet",
        "pod_ports",
        f"{{ {element} }}",
    )
    assert not (await planes[1].check_node(node)).ok, "missing anti-spoofing element"
    await planes[1].setup_node(node)
    assert element in sh(lab.node_ns(1), "nft", "list", "set", "bridge", "podnet", "pod_ports")


async def test_setup_refuses_an_underlay_mtu_too_small(lab: Lab) -> None:
    plane = lab.plane(1)
    with pytest.raises(NodeSetupRefused, match="MTU 1500 is below 1510"):
        await plane.setup_node(lab.network(1, mtu=1460))
    assert netns.run(lab.node_ns(1), ["ip", "link", "show", "br0"]).returncode != 0
    status = await plane.check_node(lab.network(1, mtu=1460))
    assert not status.ok


# --- pods -------------------------------------------------------------------------------


async def test_detach_is_idempotent_and_leaves_nothing(lab: Lab) -> None:
    planes = await up(lab, [1])
    a_ns, a = lab.pod(1, 10, "a")
    attachment = await planes[1].attach_pod(a)
    host = host_veth_name(a.container_id, "eth0")
    assert attachment.host_ifname == host and attachment.mac == "0a:58:0a:80:00:0a"
    assert "mtu 1450" in sh(a_ns, "ip", "link", "show", "eth0")
    assert "default via 10.128.0.1" in sh(a_ns, "ip", "route")
    assert await planes[1].attached_pods() == [attachment]

    await planes[1].detach_pod(a.container_id, "eth0", a.netns)
    await planes[1].detach_pod(a.container_id, "eth0", a.netns)
    netns.remove(a_ns)
    await planes[1].detach_pod(a.container_id, "eth0", None)
    assert host not in sh(lab.node_ns(1), "ip", "link")
    assert host not in sh(lab.node_ns(1), "nft", "list", "set", "bridge", "podnet", "pod_ports")
    assert await planes[1].attached_pods() == []
    assert (await planes[1].check_node(lab.network(1))).ok


async def test_failed_attach_cleans_up(lab: Lab) -> None:
    planes = await up(lab, [1])
    a_ns, a = lab.pod(1, 10, "a")
    sh(a_ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other")
    with pytest.raises(DataPlaneError, match="attaching"):
        await planes[1].attach_pod(a)
    gone = PodNetwork(**{**a.__dict__, "container_id": "gone", "netns": "/run/netns/none-x"})
    with pytest.raises(DataPlaneError, match="none-x"):
        await planes[1].attach_pod(gone)
    for pod in (a, gone):
        assert host_veth_name(pod.container_id, "eth0") not in sh(lab.node_ns(1), "ip", "link")
    assert "elements" not in sh(
        lab.node_ns(1), "nft", "list", "set", "bridge", "podnet", "pod_ports"
    )


async def test_ten_pods_attach_and_detach_in_turn(lab: Lab) -> None:
    """Ten pods in and out on one node; what each costs is measured in
    bench/bench_latencies.py (--only attach), not asserted here."""
    planes = await up(lab, [1])
    pods = [lab.pod(1, 10 + k, f"t{k}")[1] for k in range(10)]
    attached = [await planes[1].attach_pod(pod) for pod in pods]
    assert set(await planes[1].attached_pods()) == set(attached)
    for pod in pods:
        await planes[1].detach_pod(pod.container_id, pod.ifname, pod.netns)
    links = sh(lab.node_ns(1), "ip", "link")
    assert not [p for p in pods if host_veth_name(p.container_id, "eth0") in links]
    assert await planes[1].attached_pods() == []
    assert (await planes[1].check_node(lab.network(1))).ok


async def test_setup_keeps_bridged_pod_traffic_out_of_conntrack(lab: Lab) -> None:
    """br_netfilter's switches are off in the node, and a check notices one turned on."""
    planes = await up(lab, [1])
    switch = "net.bridge.bridge-nf-call-iptables"
    assert sh(lab.node_ns(1), "sysctl", "-n", switch).strip() == "0"
    sh(lab.node_ns(1), "sysctl", "-w", f"{switch}=1")
    status = await planes[1].check_node(lab.network(1))
    assert status.problems == [f"{switch} is not 0"]
    await planes[1].setup_node(lab.network(1))
    assert sh(lab.node_ns(1), "sysctl", "-n", switch).strip() == "0"
    assert (await planes[1].check_node(lab.network(1))).ok


async def test_isolation_turns_bridged_ipv4_through_the_inet_hooks(lab: Lab) -> None:
    """With isolation (multitenant, networkpolicy) the IPv4 switch is on, IPv6 stays off."""
    planes = await up(lab, [1])
    isolated = lab.network(1, isolation=True)
    assert not (await planes[1].check_node(isolated)).ok
    await planes[1].setup_node(isolated)
    assert sh(lab.node_ns(1), "sysctl", "-n", "net.bridge.bridge-nf-call-iptables") == "1\n"
    assert sh(lab.node_ns(1), "sysctl", "-n", "net.bridge.bridge-nf-call-ip6tables") == "0\n"
    assert (await planes[1].check_node(isolated)).ok


async def test_pods_wired_and_unwired_at_once_around_a_setup(lab: Lab) -> None:
    """Attaches run in parallel; a set-up in the middle neither sees half-wired pods nor
    drops their anti-spoofing entries; parallel detaches leave nothing."""
    planes = await up(lab, [1])
    node = lab.network(1)
    pods = [lab.pod(1, 10 + k, f"m{k}")[1] for k in range(12)]
    await asyncio.gather(*(planes[1].attach_pod(p) for p in pods[:6]), planes[1].setup_node(node))
    await asyncio.gather(*(planes[1].attach_pod(p) for p in pods[6:]))
    wired = await planes[1].attached_pods()
    assert sorted(a.container_id for a in wired) == sorted(p.container_id for p in pods)
    status = await planes[1].check_node(node)
    assert status.ok, status.problems
    await asyncio.gather(*(planes[1].detach_pod(p.container_id, p.ifname, p.netns) for p in pods))
    assert await planes[1].attached_pods() == []
    assert "elements" not in sh(
        lab.node_ns(1), "nft", "list", "set", "bridge", "podnet", "pod_ports"
    )
    assert (await planes[1].check_node(node)).ok
