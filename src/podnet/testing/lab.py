"""A lab of network namespaces for data plane tests: an underlay, nodes, pods.

An underlay namespace whose bridge plays the physical network (TEST-NET-2,
198.51.100.0/24), node namespaces and an outside host on it, and pod namespaces. Each
``LinuxDataPlane`` is constructed inside its node namespace. Every namespace is recorded
before it is created and removed by exact name in ``Lab.close``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network

from podnet import netns
from podnet.dataplane.interface import NodeNetwork, PodNetwork, RemoteNode
from podnet.dataplane.linux import LinuxDataPlane, portsecurity
from podnet.dataplane.linux.policyvalues import TABLE_KEY

UNDERLAY = IPv4Network("198.51.100.0/24")
EXTERNAL_IP = IPv4Address("198.51.100.100")
CLUSTER = IPv4Network("10.128.0.0/14")
SERVICES = IPv4Network("172.30.0.0/16")
MTU = 1450
SERVER = """
import socket, sys
s = socket.socket(); s.settimeout(15)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
conn, peer = s.accept(); conn.sendall(peer[0].encode()); conn.close()
"""
CLIENT = """
import socket, sys, time
deadline = time.monotonic() + 8
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.1)
print(c.recv(100).decode())
"""


def sh(ns: str, *argv: str) -> str:
    """Run ``argv`` in namespace ``ns``; fail the test on error."""
    done = netns.run(ns, argv, timeout=30)
    assert done.returncode == 0, f"{argv} in {ns}: {done.stderr}"
    return done.stdout


def ip(ns: str, command: str) -> str:
    """``ip <command>`` in namespace ``ns`` (words split on spaces)."""
    return sh(ns, "ip", *command.split())


def ping(ns: str, ip: IPv4Address | str, *extra: str, count: int = 3) -> bool:
    argv = ["ping", "-n", "-q", "-c", str(count), "-W", "1", "-i", "0.2", *extra, str(ip)]
    return netns.run(ns, argv, timeout=15).returncode == 0


def reaches(ns: str, ip: IPv4Address | str, within: float = 10.0) -> bool:
    """Whether one echo from ``ns`` is answered within ``within`` seconds: a first contact
    that may wait on ARP (the pod's, and a switch's for the tunnel's next hop), which a
    loaded machine can stretch past a short ``ping``."""
    argv = ["ping", "-n", "-q", "-c", "1", "-i", "0.2", "-w", f"{within:g}", str(ip)]
    return netns.run(ns, argv, timeout=within + 5).returncode == 0


TCP_PORT = 18080


def tcp_peer_seen(
    client_ns: str, server_ns: str, server_ip: IPv4Address, via: IPv4Address | None = None
) -> str:
    """Connect from ``client_ns`` (to ``via``, a service address, when given) to a server
    on ``server_ip`` port ``TCP_PORT``; return the peer address the server saw."""
    port = str(TCP_PORT)
    server = subprocess.Popen(
        netns.command(server_ns, [sys.executable, "-c", SERVER, str(server_ip), port]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        target = str(via or server_ip)
        done = netns.run(client_ns, [sys.executable, "-c", CLIENT, target, port], 20)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()
    finally:
        try:
            server.wait(timeout=20)
        finally:
            server.kill()  # a no-op once it has exited


@dataclass
class Lab:
    """Namespaces of one test and helpers to build nodes and pods in them."""

    run: str
    created: list[str] = field(default_factory=list)
    planes: list[LinuxDataPlane] = field(default_factory=list)

    def namespace(self, suffix: str) -> str:
        name = f"{self.run}-{suffix}"
        self.created.append(name)  # recorded first: removed even if creation half fails
        netns.create(name)
        return name

    @property
    def underlay(self) -> str:
        return f"{self.run}-ul"

    def node_ns(self, i: int) -> str:
        return f"{self.run}-n{i}"

    def node_ip(self, i: int) -> IPv4Address:
        return UNDERLAY.network_address + 10 + i

    def subnet(self, i: int) -> IPv4Network:
        return IPv4Network(f"10.128.{2 * (i - 1)}.0/23")

    def plug(self, ns: str, port: str, address: IPv4Interface) -> None:
        """A veth from the underlay bridge into ``ns`` (eth0 there), born in place."""
        ip(self.underlay, f"link add {port} type veth peer name eth0 netns {ns}")
        sh(self.underlay, "ip", "link", "set", port, "master", "ul", "up")
        sh(ns, "ip", "addr", "add", str(address), "dev", "eth0")
        sh(ns, "ip", "link", "set", "eth0", "up")

    def build(self, nodes: int = 3) -> None:
        self.namespace("ul")
        sh(self.underlay, "ip", "link", "add", "ul", "type", "bridge")
        sh(self.underlay, "ip", "link", "set", "ul", "up")
        external = self.namespace("ext")
        self.plug(external, "u-ext", IPv4Interface(f"{EXTERNAL_IP}/24"))
        for i in range(1, nodes + 1):
            self.plug(self.namespace(f"n{i}"), f"u-n{i}", IPv4Interface(f"{self.node_ip(i)}/24"))

    def port_security(self) -> None:
        """Port security on the underlay's switch, as on a managed switch: each port
        takes frames only with the source MAC of the host plugged into it."""
        hosts = {"u-ext": f"{self.run}-ext"}
        hosts |= {
            f"u-n{i}": self.node_ns(i) for i in range(1, 100) if self.node_ns(i) in self.created
        }
        ports = {port: self.underlay_mac(ns) for port, ns in hosts.items()}
        with netns.entered(self.underlay):
            portsecurity.apply(ports)

    def network(self, i: int, tunnel: str = "vxlan", **overrides: object) -> NodeNetwork:
        values: dict[str, object] = {
            "node_name": f"node-{i}",
            "node_ip": self.node_ip(i),
            "subnet": self.subnet(i),
            "cluster_networks": (CLUSTER,),
            "service_network": SERVICES,
            "mtu": MTU,
            "tunnel": tunnel,
        }
        values.update(overrides)
        return NodeNetwork(**values)  # type: ignore[arg-type]

    def remote(self, i: int, *, mac: bool = True) -> RemoteNode:
        """Node ``i`` as its peers see it: with the underlay MAC it publishes (``mac``
        False: a node that publishes none, such as an older agent). A node the lab did not
        build gets a made-up MAC (``02:58:`` + its IP)."""
        ns, ip = self.node_ns(i), self.node_ip(i)
        made_up = "02:58:" + ":".join(f"{b:02x}" for b in ip.packed)
        published = (self.underlay_mac(ns) if ns in self.created else made_up) if mac else None
        return RemoteNode(f"node-{i}", ip, self.subnet(i), published)

    def underlay_mac(self, ns: str) -> str:
        """The MAC of ``ns``'s interface on the underlay (its ``eth0``)."""
        return link_mac(ns, "eth0")

    def plane(self, i: int) -> LinuxDataPlane:
        with netns.entered(self.node_ns(i)):
            plane = LinuxDataPlane()
        self.planes.append(plane)
        return plane

    def pod(self, node: int, host: int, tag: str) -> tuple[str, PodNetwork]:
        """A pod namespace (created here) and the pod's values."""
        ns = self.namespace(f"p-{tag}")
        return ns, self.pod_network(node, host, tag, str(netns.path(ns)))

    def pod_network(self, node: int, host: int, tag: str, sandbox: str) -> PodNetwork:
        """Pod ``tag``'s values: address ``host`` in node ``node``'s subnet, in ``sandbox``."""
        subnet = self.subnet(node)
        return PodNetwork(
            container_id=f"{self.run}-{tag}",
            netns=sandbox,
            ifname="eth0",
            address=IPv4Interface(f"{subnet.network_address + host}/{subnet.prefixlen}"),
            gateway=subnet.network_address + 1,
            mtu=MTU,
            routes=(CLUSTER,),
        )

    async def close(self) -> None:
        """Close the data planes, then remove every namespace (by exact name)."""
        try:
            for plane in self.planes:
                await plane.close()
        finally:
            for name in reversed(self.created):
                netns.remove(name)


def link_mac(ns: str, name: str) -> str:
    """The MAC of interface ``name`` in namespace ``ns``, lower case."""
    return str(json.loads(sh(ns, "ip", "-j", "link", "show", "dev", name))[0]["address"]).lower()


def unique_run(tag: str) -> str:
    """A namespace prefix no other run and no other test shares."""
    return f"{tag}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


@contextlib.asynccontextmanager
async def built_lab(tag: str, nodes: int = 3) -> AsyncIterator[Lab]:
    """An underlay, the outside host and ``nodes`` nodes; everything removed afterwards,
    also when the body (or the build itself) fails."""
    lab = Lab(unique_run(tag))
    try:
        lab.build(nodes)
        yield lab
    finally:
        await lab.close()


async def up(lab: Lab, nodes: list[int], tunnel: str = "vxlan") -> dict[int, LinuxDataPlane]:
    """Set the nodes up and give each the others as remotes."""
    planes = {i: lab.plane(i) for i in nodes}
    for i, plane in planes.items():
        await plane.setup_node(lab.network(i, tunnel))
    for i, plane in planes.items():
        remotes = [lab.remote(j) for j in nodes if j != i]
        await plane.sync_remote_nodes(lab.network(i, tunnel), remotes)
    return planes


def policy_table(ns: str) -> dict[str, str] | None:
    """The policy table of namespace ``ns`` as blocks (``set NAME``, ``chain NAME`` → their
    lines), so two tables compare regardless of the order nft lists them in; None when
    there is no table."""
    done = netns.run(ns, ["nft", "list", "table", *TABLE_KEY.split()], timeout=30)
    if done.returncode != 0:
        return None
    blocks: dict[str, str] = {}
    head, lines = "", list[str]()
    for line in done.stdout.splitlines()[1:]:
        text = line.strip()
        if text.endswith("{") and not head:
            head, lines = text, []
        elif text == "}" and head:
            blocks[head], head = "\n".join(lines), ""
        elif head:
            lines.append(text)
    return blocks


def assert_spoofing_dropped(a_ns: str, a: PodNetwork, b: PodNetwork) -> None:
    """Pod ``a`` (in ``a_ns``, reaching ``b`` with its real identity) forges a source IP
    (to ``b`` and to the gateway) and then a source MAC: nothing gets through; its real
    identity still works afterwards."""
    sh(a_ns, "ip", "addr", "add", "10.128.0.77/23", "dev", "eth0")
    assert not ping(a_ns, b.address.ip, "-I", "10.128.0.77", count=2), "spoofed source IP"
    assert not ping(a_ns, "10.128.0.1", "-I", "10.128.0.77", count=2), "spoofed IP to gateway"
    sh(a_ns, "ip", "addr", "del", "10.128.0.77/23", "dev", "eth0")

    sh(a_ns, "ip", "link", "set", "eth0", "address", "0a:58:0a:80:00:63")
    sh(a_ns, "ip", "neigh", "flush", "all")
    assert not ping(a_ns, b.address.ip, count=2), "spoofed source MAC"
    sh(a_ns, "ip", "link", "set", "eth0", "address", a.mac)
    assert ping(a_ns, b.address.ip), "the real identity still works"
