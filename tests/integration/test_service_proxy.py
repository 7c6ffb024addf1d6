"""The service proxy on the linux data plane, decided by real traffic.

Two nodes (VXLAN, subnet mode: bridged traffic skips netfilter) on the lab's underlay,
the lab's outside host, and three pods: ``a`` and ``b`` on node-1, ``c`` on node-2, each
answering ``<pod> <peer address>`` on TCP and UDP 8080 (``podnet.testing.servicelab``).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import AsyncIterator
from ipaddress import IPv4Address

import pytest

from podnet import netns
from podnet.services.model import Endpoint, ServicePort
from podnet.testing.lab import EXTERNAL_IP, sh
from podnet.testing.servicelab import Cluster, outside, service_cluster

pytestmark = [pytest.mark.root]
ECHO = [sys.executable, "-m", "podnet.cluster.echo"]


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with service_cluster("psvc") as the_cluster:
        yield the_cluster


async def test_cluster_ip_spreads_over_every_endpoint(cluster: Cluster) -> None:
    web = cluster.service("web", 10, "a", "b", "c")
    await cluster.apply(web)
    for client in ("b", "c"):  # same node as two endpoints, and the other node
        seen = cluster.client(cluster.netns_of[client], web.cluster_ip, count=300)
        assert seen.errors == {}
        counts = seen.by_pod()
        assert set(counts) == {"a", "b", "c"}, counts
        assert max(counts.values()) <= 150, counts  # none gets more than half
    # the node itself, through the data plane's service route and the output hook
    from_node = cluster.client(cluster.lab.node_ns(2), web.cluster_ip, count=30)
    assert from_node.errors == {} and sum(from_node.by_pod().values()) == 30


async def test_affinity_holds_one_endpoint(cluster: Cluster) -> None:
    sticky = cluster.service("sticky", 11, "a", "b", "c", affinity_seconds=600)
    await cluster.apply(sticky)
    for client in ("b", "c"):
        seen = cluster.client(cluster.netns_of[client], sticky.cluster_ip, count=40)
        assert seen.errors == {} and len(seen.by_pod()) == 1, seen


async def test_no_endpoints_is_refused_not_blackholed(cluster: Cluster) -> None:
    empty = cluster.service("empty", 12)
    udp_empty = cluster.service("empty", 12, protocol="udp")
    await cluster.apply(empty, udp_empty, cluster.service("np", 13, node_port=30012))
    for client in (cluster.netns_of["b"], cluster.netns_of["c"], cluster.lab.node_ns(1)):
        assert cluster.client(client, empty.cluster_ip).errors == {"refused": 1}, client
    udp = cluster.client(cluster.netns_of["b"], udp_empty.cluster_ip, proto="udp", sport=40001)
    assert udp.errors == {"refused": 1}  # ICMP port unreachable
    node_port = cluster.client(outside(cluster.lab), cluster.lab.node_ip(1), 30012)
    assert node_port.errors == {"refused": 1}


async def test_hairpin_and_same_node_endpoints_answer(cluster: Cluster) -> None:
    only_a = cluster.service("only-a", 14, "a")
    await cluster.apply(only_a)
    hairpin = cluster.client(cluster.netns_of["a"], only_a.cluster_ip, count=5)
    assert hairpin.by_pod() == {"a": 5}
    gateway = str(cluster.lab.subnet(1).network_address + 1)
    assert hairpin.peers() == {gateway}  # masqueraded, so the reply comes back
    same_node = cluster.client(cluster.netns_of["b"], only_a.cluster_ip, count=5)
    assert same_node.by_pod() == {"a": 5}
    other_node = cluster.client(cluster.netns_of["c"], only_a.cluster_ip, count=5)
    assert other_node.by_pod() == {"a": 5}
    assert other_node.peers() == {str(cluster.ip_of["c"])}  # the client's own address


async def test_node_ports_external_ips_and_traffic_policies(cluster: Cluster) -> None:
    lab = cluster.lab
    external = IPv4Address("203.0.113.10")
    sh(outside(lab), "ip", "route", "add", f"{external}/32", "via", str(lab.node_ip(1)))
    spread = cluster.service("spread", 15, "a", "c", node_port=30015, external_ips=(external,))
    local = cluster.service("local", 16, "a", node_port=30016, external_local=True)
    await cluster.apply(spread, local)
    for node in (1, 2):  # every node's address, from the outside host and a node
        for source in (outside(lab), lab.node_ns(3 - node), cluster.netns_of["b"]):
            seen = cluster.client(source, lab.node_ip(node), 30015, count=20)
            assert seen.errors == {} and set(seen.by_pod()) <= {"a", "c"}, (node, source, seen)
    via_external = cluster.client(outside(lab), external, 80, count=20)
    assert via_external.errors == {} and set(via_external.by_pod()) <= {"a", "c"}
    from_outside = cluster.client(outside(lab), lab.node_ip(1), 30016, count=5)
    assert from_outside.by_pod() == {"a": 5}
    assert from_outside.peers() == {str(EXTERNAL_IP)}  # Local keeps the client's address
    no_local = cluster.client(outside(lab), lab.node_ip(2), 30016)
    assert no_local.errors == {"TimeoutError": 1}  # node-2 has no endpoint: it does not answer
    from_pod = cluster.client(cluster.netns_of["c"], lab.node_ip(2), 30016, count=3)
    assert from_pod.by_pod() == {"a": 3}  # its own pods take the cluster-IP way


async def test_internal_traffic_policy_local(cluster: Cluster) -> None:
    near = cluster.service("near", 17, "a", "c", internal_local=True)
    await cluster.apply(near)
    assert cluster.client(cluster.netns_of["b"], near.cluster_ip, count=20).by_pod() == {"a": 20}
    assert cluster.client(cluster.netns_of["c"], near.cluster_ip, count=20).by_pod() == {"c": 20}


async def test_removed_udp_endpoint_loses_its_conntrack_entries(cluster: Cluster) -> None:
    dns = cluster.service("dns", 18, "a", "c", protocol="udp")
    await cluster.apply(dns)
    ns, sport = cluster.netns_of["b"], 40002  # one source port: one conntrack entry
    first = cluster.client(ns, dns.cluster_ip, proto="udp", sport=sport).by_pod()
    (chosen,) = first
    again = cluster.client(ns, dns.cluster_ip, count=5, proto="udp", sport=sport).by_pod()
    assert again == {chosen: 5}  # the entry holds it
    other = "c" if chosen == "a" else "a"
    await cluster.apply(cluster.service("dns", 18, other, protocol="udp"))
    after = cluster.client(ns, dns.cluster_ip, count=3, proto="udp", sport=sport).by_pod()
    assert after == {other: 3}  # the removed endpoint's server still runs: only the
    # flush sends the datagrams elsewhere


STREAM = """
import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection((sys.argv[1], 80), timeout=5); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.1)
print("connected", flush=True)
for line in sys.stdin:
    c.sendall(line.encode()); print(c.recv(100).decode().strip(), flush=True)
"""


async def test_a_second_sync_and_a_restarted_plane_change_nothing(cluster: Cluster) -> None:
    web = cluster.service("web", 10, "a", "c", node_port=30010, affinity_seconds=60)
    echo_ip = cluster.ip_of["c"]
    echo = dataclasses.replace(
        cluster.service("echo", 11), endpoints=(Endpoint(echo_ip, 9000, local=False),)
    )
    ports = (web, cluster.service("empty", 12), echo)
    await cluster.apply(*ports)
    server = subprocess.Popen(
        netns.command(cluster.netns_of["c"], [*ECHO, "--port", "9000"]), stdout=subprocess.DEVNULL
    )
    stream = subprocess.Popen(
        netns.command(cluster.netns_of["b"], [sys.executable, "-c", STREAM, str(echo.cluster_ip)]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stream.stdin is not None and stream.stdout is not None
        assert stream.stdout.readline() == "connected\n"  # an open connection to the VIP
        await restarted_changes_nothing(cluster, ports)
        stream.stdin.write("still there\n")
        stream.stdin.flush()
        assert stream.stdout.readline() == "still there\n"  # not cut by the restart
    finally:
        for process in (stream, server):
            process.kill()
            process.wait(timeout=10)


async def restarted_changes_nothing(cluster: Cluster, ports: tuple[ServicePort, ...]) -> None:
    lab, web = cluster.lab, ports[0]
    plane = cluster.planes[1]
    before, listed = plane.services.transactions, sh(lab.node_ns(1), "nft", "-a", "list", "ruleset")
    await cluster.apply(*ports)
    assert plane.services.transactions == before  # no nft transaction at all
    restarted = lab.plane(1)
    node = lab.network(1)
    assert (await restarted.check_node(node)).ok
    table = cluster.table_for(1, *ports)
    await restarted.sync_services(node, table)
    assert restarted.services.transactions == 0
    await restarted.sync_services(node, table)  # a resync reads the kernel again
    assert restarted.services.transactions == 0
    assert sh(lab.node_ns(1), "nft", "-a", "list", "ruleset") == listed
    entry = f"{{ {web.cluster_ip} . tcp . 80 }}"  # deleted by hand: the service is gone
    sh(lab.node_ns(1), "nft", "delete", "element", "ip", "podnet_services", "service_ips", entry)
    await restarted.sync_services(node, table)  # drift is repaired at the resync
    assert restarted.services.transactions == 1
    assert cluster.client(cluster.netns_of["b"], web.cluster_ip).errors == {}
