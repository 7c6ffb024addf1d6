"""A lab for service proxy tests and benchmarks: nodes, pods with "who am I" servers,
clients that count who answered.

Two nodes (VXLAN) on the lab's underlay, the lab's outside host, and pods (by default
``a`` and ``b`` on node-1, ``c`` on node-2). Each pod runs a server on TCP and UDP 8080
that answers ``<pod> <peer address>``, so a client sees which endpoint answered and the
endpoint's view of the source. Each node gets its own ``ServiceTable`` (endpoints are
local or not per node) through ``LinuxDataPlane.sync_services``; clients run inside the
pod, node and outside-host namespaces, each a bounded loop of connections.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Any

from podnet import netns
from podnet.dataplane.linux import LinuxDataPlane
from podnet.services.model import Endpoint, ServicePort, ServiceTable
from podnet.testing.lab import SERVICES, Lab, built_lab

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
    """The lab, its nodes' data planes and the pods (keyed ``name`` or ``ns/name``)."""

    lab: Lab
    pods: dict[str, tuple[int, int]] = field(default_factory=lambda: dict(PODS))
    planes: dict[int, LinuxDataPlane] = field(default_factory=dict)
    netns_of: dict[str, str] = field(default_factory=dict)
    ip_of: dict[str, IPv4Address] = field(default_factory=dict)
    servers: list[subprocess.Popen[str]] = field(default_factory=list)
    isolation: bool = False

    def endpoints(self, node: int, *pods: str) -> tuple[Endpoint, ...]:
        found = (Endpoint(self.ip_of[p], PORT, local=self.pods[p][0] == node) for p in pods)
        return tuple(sorted(found))

    async def apply(self, *ports: ServicePort) -> None:
        """``ports`` on both nodes, each node with its own local flags."""
        for i, plane in self.planes.items():
            table = self.table_for(i, *ports)
            await plane.sync_services(self.lab.network(i, isolation=self.isolation), table)

    def table_for(self, node: int, *ports: ServicePort) -> ServiceTable:
        """Node ``node``'s table of ``ports``, with every node's address."""
        node_ips = tuple(self.lab.node_ip(n) for n in sorted(self.planes))
        found = sorted((self.for_node(p, node) for p in ports), key=key)
        return ServiceTable(tuple(found), node_ips)

    def for_node(self, port: ServicePort, node: int) -> ServicePort:
        local = [dataclasses.replace(e, local=self.node_of(e.ip) == node) for e in port.endpoints]
        return dataclasses.replace(port, endpoints=tuple(sorted(local)))

    def node_of(self, ip: IPv4Address) -> int:
        return next(self.pods[p][0] for p, pod_ip in self.ip_of.items() if pod_ip == ip)

    def service(self, name: str, host: int, *pods: str, **options: Any) -> ServicePort:
        """Service ``name`` (in ``namespace``, default ``default``) on cluster IP
        ``172.30.0.<host>``:80 with endpoints ``pods``."""
        protocol = options.pop("protocol", "tcp")
        namespace = options.pop("namespace", "default")
        return ServicePort(
            namespace,
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
    for name, (node, host) in cluster.pods.items():
        ns, pod = lab.pod(node, host, name.replace("/", "-"))
        await cluster.planes[node].attach_pod(pod)
        cluster.netns_of[name], cluster.ip_of[name] = ns, pod.address.ip
        argv = [sys.executable, "-c", WHOAMI, name, str(PORT), str(LIFETIME)]
        server = subprocess.Popen(netns.command(ns, argv), stdout=subprocess.PIPE, text=True)
        cluster.servers.append(server)
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
    return cluster


def stop_servers(cluster: Cluster) -> None:
    for server in cluster.servers:
        server.terminate()
        server.wait(timeout=10)


@contextlib.asynccontextmanager
async def service_cluster(
    tag: str, pods: dict[str, tuple[int, int]] | None = None, isolation: bool = False
) -> AsyncIterator[Cluster]:
    """A two-node lab with ``pods`` serving; everything removed afterwards."""
    async with built_lab(tag, nodes=2) as lab:
        cluster = Cluster(lab, dict(pods or PODS), isolation=isolation)
        try:
            yield await start_cluster(cluster)
        finally:
            stop_servers(cluster)
