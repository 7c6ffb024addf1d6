"""The data plane contract: what the node agent asks of a backend, in domain terms.

The agent computes the desired state (this node, the remote nodes, the pods) as plain
values; a data plane implementation (``linux``, ``ovs``, and ``fake`` for tests;
chosen by name from ``podnet.dataplane.registry``) makes the kernel match it. Every
method is idempotent: calling it again with the same input changes nothing, so the agent
can resync at any time, and after a restart. ``tests/integration/test_dataplane_contract.py``
checks these promises against every registered implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from podnet.egress.nodetable import NodeFirewall
    from podnet.policy.model import RuleSet
    from podnet.services.model import ServiceTable

Tunnel = Literal["vxlan", "host-gw"]
"""How traffic reaches other nodes' subnets: VXLAN encapsulation, or plain routes via
the remote node's IP (host-gw: every node on one L2 segment)."""
TUNNELS: tuple[Tunnel, ...] = ("vxlan", "host-gw")
VXLAN_OVERHEAD = 50  # outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14


class DataPlaneError(Exception):
    """A data plane operation failed (the message says what and why).

    As such it is transient: the same call may succeed later (a busy or missing kernel
    object, a timeout, a helper that failed to run), so the agent retries it with backoff.
    """


class DataPlaneRejected(DataPlaneError):
    """Permanent: the kernel (or ``nft``) refused the input itself, e.g. a rendered rule
    or set element it cannot parse or that is out of range. The same input will be
    refused again; the agent leaves out the objects that cause it (``podnet.reconcile``)."""


class NodeSetupRefused(DataPlaneRejected):
    """The node cannot run as configured (MTU too small, no L2 adjacency for host-gw...)."""


@dataclass(frozen=True)
class NodeNetwork:
    """Everything that decides this node's own set-up."""

    node_name: str
    node_ip: IPv4Address
    subnet: IPv4Network  # this node's HostSubnet
    cluster_networks: tuple[IPv4Network, ...]
    service_network: IPv4Network
    mtu: int  # pod MTU (ClusterNetwork mtu)
    tunnel: Tunnel = "vxlan"
    vxlan_port: int = 4789
    vni: int = 1  # VNI used for flat (subnet-plugin) traffic
    underlay_interface: str | None = None  # autodetected from node_ip when None
    isolation: bool = False  # multitenant/networkpolicy: bridged IPv4 passes the inet hooks
    # UDP queries a second one source may send to the gateway's DNS port; beyond it the
    # kernel drops them before they reach the DNS socket (None: no DNS on this node)
    dns_client_qps: float | None = None
    dns_client_burst: int = 0  # queries a source may send at once (at least one second's)
    dns_port: int = 53

    @property
    def tunnel_overhead(self) -> int:
        """Bytes the tunnel adds to each pod packet on the underlay."""
        return VXLAN_OVERHEAD if self.tunnel == "vxlan" else 0

    @property
    def gateway(self) -> IPv4Interface:
        """The subnet's first address, on br0 (the role of OpenShift SDN's tun0)."""
        return IPv4Interface(f"{self.subnet.network_address + 1}/{self.subnet.prefixlen}")

    def version_note(self) -> str:
        """A fingerprint of the set-up, written last so a half-done set-up shows."""
        nets = ",".join(str(n) for n in self.cluster_networks)
        return (
            f"podnet/1 {self.tunnel} {self.subnet} gw={self.gateway.ip} mtu={self.mtu} "
            f"vxlan={self.vxlan_port}/{self.vni} nets={nets} svc={self.service_network}"
            + (" isolation" if self.isolation else "")
        )


@dataclass(frozen=True)
class RemoteNode:
    """Another node's subnet and where to send its traffic."""

    name: str
    node_ip: IPv4Address
    subnet: IPv4Network
    # the MAC of its underlay interface, as the node published it (lower case); None when
    # it did not (an older agent): its VXLAN is then accepted by address alone
    mac: str | None = None


def pod_mac(ip: IPv4Address) -> str:
    """OpenShift SDN's MAC for a pod: ``0a:58:`` followed by the four bytes of its IP."""
    return "0a:58:" + ":".join(f"{b:02x}" for b in ip.packed)


@dataclass(frozen=True)
class PodNetwork:
    """One pod interface to wire: the agent has already allocated its IP."""

    container_id: str
    netns: str  # path, e.g. /var/run/netns/<name> or /proc/<pid>/ns/net
    ifname: str  # inside the pod, usually eth0
    address: IPv4Interface  # pod IP with the node subnet's prefix
    gateway: IPv4Address
    mtu: int
    routes: tuple[IPv4Network, ...] = ()  # extra routes via the gateway (cluster networks)
    namespace: str = "default"
    name: str = ""

    @property
    def mac(self) -> str:
        return pod_mac(self.address.ip)


@dataclass(frozen=True)
class PodAttachment:
    """What ``attach_pod`` built: names the CNI result needs, and what DEL must remove."""

    container_id: str
    host_ifname: str  # the veth end on br0
    ifname: str
    mac: str
    sandbox: str
    address: IPv4Interface
    gateway: IPv4Address
    mtu: int


@dataclass
class DataPlaneStatus:
    """What ``check_node`` found: ``ok`` means a restart may leave everything as it is."""

    ok: bool
    problems: list[str] = field(default_factory=list)


class DataPlane(Protocol):
    """A data plane implementation, registered by name in ``podnet.dataplane.registry``:
    ``linux`` (``podnet.dataplane.linux``), ``ovs`` (``podnet.dataplane.ovs``) and ``fake``
    (``podnet.dataplane.fake``)."""

    async def check_node(self, node: NodeNetwork) -> DataPlaneStatus:
        """Compare the kernel with ``node``'s set-up (bridge, address, MTU, vxlan, NAT,
        version note). Changes nothing."""

    async def setup_node(self, node: NodeNetwork) -> None:
        """Build or repair the node's set-up; write the version note last. Must not
        disturb what already matches (no link or address flap for running pods)."""

    async def sync_remote_nodes(self, node: NodeNetwork, remotes: list[RemoteNode]) -> None:
        """Make routes/FDB/neighbour entries match exactly ``remotes``: add what is
        missing, fix what is wrong, remove what is stale. Changes only what differs.
        The remotes' node IPs are then the only sources the node accepts tunnel traffic
        from (VXLAN's inner source address is trusted once decapsulated), each with its
        published underlay MAC as the outer source where it is on the underlay's subnet
        (``podnet.dataplane.vteppeers``)."""

    async def attach_pod(self, pod: PodNetwork) -> PodAttachment:
        """Wire one pod interface: veth, address, MAC, routes, MTU, anti-spoofing."""

    async def detach_pod(self, container_id: str, ifname: str, netns: str | None) -> None:
        """Undo ``attach_pod``; succeeds if parts (or all) are already gone."""

    async def attached_pods(self) -> list[PodAttachment]:
        """The pods this node has wired (from the kernel), for resync and GC."""

    async def sync_policy(self, node: NodeNetwork, rules: RuleSet) -> None:
        """Make the isolation and policy rules of this node equal ``rules`` (the compiled
        cluster-wide ``RuleSet``): add what is missing, remove what is stale, in one
        atomic change. Subnet mode, or an empty rule set, leaves no policy rule at all."""

    async def sync_services(self, node: NodeNetwork, table: ServiceTable) -> None:
        """Make the service proxy of this node forward exactly ``table`` (cluster IPs,
        node ports, external IPs to their endpoints): one atomic change of only what
        differs, none when nothing does, so established connections survive a resync or
        an agent restart. An empty table leaves no service rule at all."""

    async def sync_egress_firewall(self, node: NodeNetwork, firewall: NodeFirewall) -> None:
        """Make the egress firewall of this node equal ``firewall``: the local pods it names
        reach no destination outside the cluster and service networks that their
        network's intervals deny (after service DNAT), every packet judged; one atomic
        change, none when nothing differs. An empty firewall leaves no rule at all."""

    async def close(self) -> None:
        """Release netlink sockets and helper threads."""
