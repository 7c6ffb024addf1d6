"""The node agent's configuration: its flags, its network from the master, its address.

``AgentConfig`` holds the flags; every field has the default a real host uses and
``podnet node`` exposes each as an option. ``node_network`` combines them with this
node's HostSubnet and ClusterNetwork ``default`` into the data plane's ``NodeNetwork``.
The node IP, when not given, is the first global IPv4 address of the interface holding
the default route in the agent's network namespace, else the first global IPv4 address
of any interface (a node namespace of the local virtual cluster has no default route).
"""

from __future__ import annotations

import asyncio
import math
import socket
from dataclasses import dataclass, field, fields
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podnet.cni.shim import DEFAULT_SOCKET
from podnet.dataplane.interface import NodeNetwork, Tunnel
from podnet.dns.ratelimit import BURST_SECONDS, ClientLimits
from podnet.model.network import uses_vnids

if TYPE_CHECKING:
    from podnet.dns.sync import DnsSettings

DEFAULT_CNI_BIN_DIR = Path("/opt/cni/bin")
DEFAULT_CNI_CONF_DIR = Path("/etc/cni/net.d")
DEFAULT_STATE_DIR = Path("/var/lib/podnet/node")
DEFAULT_IPAM_DIR = Path("/var/lib/cni/networks")
DEFAULT_SOCKET_PATH = Path(DEFAULT_SOCKET)
DEFAULT_NETWORK_NAME = "podnet"
DEFAULT_RESYNC_PERIOD = 30.0
RT_SCOPE_UNIVERSE = 0
DEFAULT_MTU = 1450
DEFAULT_VXLAN_PORT = 4789
DEFAULT_UPSTREAM_RESOLV_CONF = Path("/etc/resolv.conf")  # the node's resolvers, for DNS

Obj = dict[str, Any]


class NodeIPNotFound(Exception):
    """No usable IPv4 address in this network namespace."""


@dataclass(frozen=True)
class AgentConfig:
    """What one ``podnet node`` needs to know before it talks to the master."""

    node_name: str
    kubeconfig: Path | None = None  # None: $KUBECONFIG, then ~/.kube/config
    node_ip: IPv4Address | None = None  # None: autodetect (``resolved_node_ip``)
    tunnel: Tunnel = "vxlan"
    cni_bin_dir: Path = DEFAULT_CNI_BIN_DIR
    cni_conf_dir: Path = DEFAULT_CNI_CONF_DIR
    socket_path: Path = DEFAULT_SOCKET_PATH
    state_dir: Path = DEFAULT_STATE_DIR
    ipam_dir: Path = DEFAULT_IPAM_DIR
    network_name: str = DEFAULT_NETWORK_NAME
    pod_namespace: str = "default"  # for pods whose runtime sends no K8S_POD_NAMESPACE
    resync_period: float = DEFAULT_RESYNC_PERIOD
    metrics_address: str | None = None  # HOST:PORT of /metrics; None: not served
    dns: bool = True  # serve the cluster DNS on the pod subnet's gateway, port 53
    dns_upstream_resolv_conf: Path = DEFAULT_UPSTREAM_RESOLV_CONF
    dns_pod_records: str = "verified"  # verified (watches Pods), insecure or disabled
    dns_device: str = "br0"  # the gateway's device, which the DNS binds to (ovs: tun0)
    dns_client_limits: ClientLimits = field(default_factory=ClientLimits)  # per pod, in DNS

    @property
    def conflist_path(self) -> Path:
        """The CNI config list the agent writes for runtimes."""
        return self.cni_conf_dir / f"10-{self.network_name}.conflist"

    async def resolved_node_ip(self) -> IPv4Address:
        """The configured node IP, or the one detected in this network namespace.

        The detection runs in a worker thread: pyroute2's synchronous ``IPRoute`` drives
        an event loop of its own, which cannot run inside the agent's running loop
        (``RuntimeError: This event loop is already running``)."""
        if self.node_ip is not None:
            return self.node_ip
        return await asyncio.to_thread(detect_node_ip)


def hostsubnet_problem(hostsubnet: Obj | None, node_ip: IPv4Address) -> str | None:
    """Why ``hostsubnet`` is not usable yet, or None when it is."""
    if hostsubnet is None:
        return "not created yet"
    if not hostsubnet.get("subnet"):
        return "no subnet assigned yet"
    if hostsubnet.get("hostIP") != str(node_ip):
        return f"its hostIP is {hostsubnet.get('hostIP')}, not {node_ip}"
    return None


def node_network(
    config: AgentConfig, node_ip: IPv4Address, hostsubnet: Obj, cluster_network: Obj
) -> NodeNetwork:
    """This node's ``NodeNetwork`` from its HostSubnet and ClusterNetwork ``default``."""
    return NodeNetwork(
        node_name=config.node_name,
        node_ip=node_ip,
        subnet=IPv4Network(hostsubnet["subnet"]),
        cluster_networks=tuple(
            IPv4Network(entry["CIDR"]) for entry in cluster_network["clusterNetworks"]
        ),
        service_network=IPv4Network(cluster_network["serviceNetwork"]),
        mtu=int(cluster_network.get("mtu") or DEFAULT_MTU),
        tunnel=config.tunnel,
        vxlan_port=int(cluster_network.get("vxlanPort") or DEFAULT_VXLAN_PORT),
        isolation=uses_vnids(str(cluster_network.get("pluginName") or "")),
        dns_client_qps=config.dns_client_limits.qps if config.dns else None,
        dns_client_burst=math.ceil(config.dns_client_limits.qps * BURST_SECONDS),
    )


def network_changes(old: NodeNetwork, new: NodeNetwork) -> list[str]:
    """The fields that differ, as ``name: old -> new``."""
    out = []
    for f in fields(NodeNetwork):
        before, after = getattr(old, f.name), getattr(new, f.name)
        if before != after:
            out.append(f"{f.name}: {before} -> {after}")
    return out


def cluster_network_problem(network: Obj | None, node_ip: IPv4Address) -> str | None:
    """Why ClusterNetwork ``default`` is not usable yet, or None when it is."""
    if network is None:
        return "ClusterNetwork default not created yet"
    if not network.get("clusterNetworks") or not network.get("serviceNetwork"):
        return "ClusterNetwork default is incomplete"
    return None


def default_node_name() -> str:
    """The host name, as kubelet uses it by default (lowercase)."""
    return socket.gethostname().lower()


def _global_ipv4(addresses: list[Any], index: int | None = None) -> list[IPv4Address]:
    found = []
    for msg in addresses:
        if index is not None and msg["index"] != index:
            continue
        address = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
        if msg["scope"] == RT_SCOPE_UNIVERSE and address:
            found.append(IPv4Address(address))
    return found


def detect_node_ip() -> IPv4Address:
    """The default-route interface's first global IPv4 address, else any global one.

    Synchronous (pyroute2's ``IPRoute``): from a coroutine, call it in a thread
    (``AgentConfig.resolved_node_ip`` does)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        addresses = list(ipr.get_addr(family=socket.AF_INET))
        for route in ipr.get_default_routes(family=socket.AF_INET):
            found = _global_ipv4(addresses, route.get_attr("RTA_OIF"))
            if found:
                return found[0]
    found = _global_ipv4(addresses)
    if not found:
        raise NodeIPNotFound("no global IPv4 address in this network namespace; use --node-ip")
    return found[0]


def dns_settings(config: AgentConfig) -> DnsSettings:
    """The cluster DNS's settings from the agent's."""
    from podnet.dns.server import Limits
    from podnet.dns.sync import DnsSettings

    return DnsSettings(
        device=config.dns_device,
        upstream_resolv_conf=config.dns_upstream_resolv_conf,
        pod_records=config.dns_pod_records,
        limits=Limits(clients=config.dns_client_limits),
    )
