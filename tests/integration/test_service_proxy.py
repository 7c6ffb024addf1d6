"""The service proxy on the linux data plane, decided by real traffic.

Two nodes (VXLAN, subnet mode: bridged traffic skips netfilter) on the lab's underlay,
the lab's outside host, and three pods: ``a`` and ``b`` on node-1, ``c`` on node-2. Each
pod runs a "who am I" server on TCP and UDP 8080 that answers ``<pod> <peer address>``,
so a client sees which endpoint answered and the endpoint's view of the source. Each
node gets its own ``ServiceTable`` (endpoints are local or not per node) through
``LinuxDataPlane.sync_services``; clients run inside the pod, node and outside-host
namespaces.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Any

import pytest

from podnet import netns
from podnet.dataplane.linux import LinuxDataPlane
from podnet.services.model import Endpoint, ServicePort, ServiceTable
from podnet.testing.lab import EXTERNAL_IP, SERVICES, Lab, built_lab, sh

pytestmark = [pytest.mark.root]

PODS = {"a": (1, 10), "b": (1, 11), "c": (2, 10)}  # pod -> (node, host part)
PORT = 8080
LIFETIME = 300  # seconds a server lives at most
WHOAMI = """
import socket, sys, threading, time
name, port = sys.argv[1], int(sys.argv[2])
def tcp(s):
    while True:
        c, peer = s.accept(); c.sendall(f"{name} {peer[0]}\\n".encode()); c.close()
def udp(u):
    while True:
        data, peer = u.recvfrom(512); u.sendto(f"{name} {peer[0]}\\n".encode(), peer)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen(512)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", port))
threading.Thread(target=tcp, args=(s,), daemon=True).start()
threading.Thread(target=udp, args=(u,), daemon=True).start()
print("ready", flush=True); time.sleep(float(sys.argv[3]))
"""
CLIENT = """
import collections, json, socket, sys
ip, proto = sys.argv[1], sys.argv[4]
port, count, sport = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
answers, errors = collections.Counter(), collections.Counter()
for _ in range(count):
    try:
        if proto == "tcp":
            with socket.create_connection((ip, port), timeout=2) as c:
                data = c.makefile().readline()
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                u.bind(("0.0.0.0", sport)); u.settimeout(2); u.connect((ip, port)); u.send(b"?")
                data = u.recv(512).decode()
        answers[data.strip()] += 1
    except ConnectionRefusedError:
        errors["refused"] += 1
    except OSError as exc:
        errors[type(exc).__name__] += 1
print(json.dumps({"answers": answers, "errors": errors}))
"""


@dataclass
class Result:
    """What a client saw: answers (``pod peer``) and errors by kind, counted."""

    answers: dict[str, int]
    errors: dict[str, int]

    def by_pod(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for answer, n in self.answers.items():
            counts[answer.split()[0]] = counts.get(answer.split()[0], 0) + n
        return counts

    def peers(self) -> set[str]:
        return {answer.split()[1] for answer in self.answers}


@dataclass
class Cluster:
    lab: Lab
    planes: dict[int, LinuxDataPlane] = field(default_factory=dict)
    netns_of: dict[str, str] = field(default_factory=dict)
    ip_of: dict[str, IPv4Address] = field(default_factory=dict)
    servers: list[subprocess.Popen[str]] = field(default_factory=list)
    isolation: bool = False

    def endpoints(self, node: int, *pods: str) -> tuple[Endpoint, ...]:
        return tuple(sorted(Endpoint(self.ip_of[p], PORT, local=PODS[p][0] == node) for p in pods))

    async def apply(self, *ports: ServicePort) -> None:
        """``ports`` (with endpoints named by pod in ``port_name``-free form: see
        ``service``) on both nodes, each with its own local flags."""
        for i, plane in self.planes.items():
            table = ServiceTable(tuple(sorted((self.for_node(p, i) for p in ports), key=key)))
            await plane.sync_services(self.lab.network(i, isolation=self.isolation), table)

    def for_node(self, port: ServicePort, node: int) -> ServicePort:
        local = [dataclasses.replace(e, local=self.node_of(e.ip) == node) for e in port.endpoints]
        return dataclasses.replace(port, endpoints=tuple(sorted(local)))

    def node_of(self, ip: IPv4Address) -> int:
        return next(PODS[p][0] for p, pod_ip in self.ip_of.items() if pod_ip == ip)

    def service(self, name: str, host: int, *pods: str, **options: Any) -> ServicePort:
        """Service ``name`` on cluster IP ``172.30.0.<host>``:80 with endpoints ``pods``."""
        protocol = options.pop("protocol", "tcp")
        return ServicePort(
            "default",
            name,
            "",
            protocol,
            80,
            SERVICES.network_address + host,
            endpoints=self.endpoints(1, *pods),
            **options,
        )

    def client(
        self,
        ns: str,
        ip: object,
        port: int = 80,
        count: int = 1,
        proto: str = "tcp",
        sport: int = 0,
    ) -> Result:
        argv = [sys.executable, "-c", CLIENT, str(ip), str(port), str(count), proto, str(sport)]
        done = netns.run(ns, argv, timeout=120)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        return Result(found["answers"], found["errors"])


def key(port: ServicePort) -> str:
    return port.key


def outside(lab: Lab) -> str:
    """The outside host's namespace, on the underlay (``EXTERNAL_IP``)."""
    return f"{lab.run}-ext"


async def start_cluster(cluster: Cluster) -> Cluster:
    lab, isolation = cluster.lab, cluster.isolation
    for i in (1, 2):
        cluster.planes[i] = plane = lab.plane(i)
        await plane.setup_node(lab.network(i, isolation=isolation))
        await plane.sync_remote_nodes(lab.network(i), [lab.remote(3 - i)])
    for name, (node, host) in PODS.items():
        ns, pod = lab.pod(node, host, name)
        await cluster.planes[node].attach_pod(pod)
        cluster.netns_of[name], cluster.ip_of[name] = ns, pod.address.ip
        argv = [sys.executable, "-c", WHOAMI, name, str(PORT), str(LIFETIME)]
        server = subprocess.Popen(netns.command(ns, argv), stdout=subprocess.PIPE, text=True)
        cluster.servers.append(server)
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
    return cluster


def route_services(lab: Lab, node: int) -> None:
    """Let the node itself reach cluster IPs (the output hook): lab nodes have no default
    route, which real hosts send service traffic on its way with. The route goes back out
    of br0, so the node would send ICMP redirects to pods, and a redirect takes the
    per-host ICMP token that a port unreachable needs: turned off here."""
    ns = lab.node_ns(node)
    sh(ns, "ip", "route", "add", str(SERVICES), "dev", "br0")
    for conf in ("all", "br0"):
        sh(ns, "sysctl", "-q", "-w", f"net.ipv4.conf.{conf}.send_redirects=0")


def stop_servers(cluster: Cluster) -> None:
    for server in cluster.servers:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with built_lab("psvc", nodes=2) as lab:
        the_cluster = Cluster(lab)
        try:
            yield await start_cluster(the_cluster)
        finally:
            stop_servers(the_cluster)


async def test_cluster_ip_spreads_over_every_endpoint(cluster: Cluster) -> None:
    web = cluster.service("web", 10, "a", "b", "c")
    await cluster.apply(web)
    for client in ("b", "c"):  # same node as two endpoints, and the other node
        seen = cluster.client(cluster.netns_of[client], web.cluster_ip, count=300)
        assert seen.errors == {}
        counts = seen.by_pod()
        assert set(counts) == {"a", "b", "c"}, counts
        assert max(counts.values()) <= 150, counts  # none gets more than half
    route_services(cluster.lab, 2)
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
    for node in (1, 2):  # without a route, a pod's packet ends in "no route", not here
        route_services(cluster.lab, node)
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


async def test_a_second_sync_and_a_restarted_plane_change_nothing(cluster: Cluster) -> None:
    lab = cluster.lab
    web = cluster.service("web", 10, "a", "c", node_port=30010, affinity_seconds=60)
    await cluster.apply(web, cluster.service("empty", 12))
    plane = cluster.planes[1]
    before, listed = plane.services.transactions, sh(lab.node_ns(1), "nft", "-a", "list", "ruleset")
    await cluster.apply(web, cluster.service("empty", 12))
    assert plane.services.transactions == before  # no nft transaction at all
    restarted = lab.plane(1)
    node = lab.network(1)
    assert (await restarted.check_node(node)).ok
    table = ServiceTable(
        tuple(
            sorted(
                [cluster.for_node(web, 1), cluster.for_node(cluster.service("empty", 12), 1)],
                key=key,
            )
        )
    )
    await restarted.sync_services(node, table)
    assert restarted.services.transactions == 0
    await restarted.sync_services(node, table)  # a resync reads the kernel again
    assert restarted.services.transactions == 0
    assert sh(lab.node_ns(1), "nft", "-a", "list", "ruleset") == listed
    sh(lab.node_ns(1), "nft", "flush", "chain", "ip", "podnet_services", "services")
    await restarted.sync_services(node, table)  # drift is repaired at the resync
    assert restarted.services.transactions == 1
    assert cluster.client(cluster.netns_of["b"], web.cluster_ip).errors == {}
