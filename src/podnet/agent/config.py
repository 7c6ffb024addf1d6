"""The node agent's configuration, and finding the node's own address.

Every field has the default a real host uses; ``podnet node`` exposes each as an option.
The node IP, when not given, is the first global IPv4 address of the interface holding
the default route in the agent's network namespace, else the first global IPv4 address
of any interface (a node namespace of the local virtual cluster has no default route).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from podnet.cni.shim import DEFAULT_SOCKET
from podnet.dataplane.interface import Backend

DEFAULT_CNI_BIN_DIR = Path("/opt/cni/bin")
DEFAULT_CNI_CONF_DIR = Path("/etc/cni/net.d")
DEFAULT_STATE_DIR = Path("/var/lib/podnet/node")
DEFAULT_IPAM_DIR = Path("/var/lib/cni/networks")
DEFAULT_NETWORK_NAME = "podnet"
DEFAULT_RESYNC_PERIOD = 30.0
RT_SCOPE_UNIVERSE = 0


class NodeIPNotFound(Exception):
    """No usable IPv4 address in this network namespace."""


@dataclass(frozen=True)
class AgentConfig:
    """What one ``podnet node`` needs to know before it talks to the master."""

    node_name: str
    kubeconfig: Path | None = None  # None: $KUBECONFIG, then ~/.kube/config
    node_ip: IPv4Address | None = None  # None: autodetect (``resolved_node_ip``)
    backend: Backend = "vxlan"
    cni_bin_dir: Path = DEFAULT_CNI_BIN_DIR
    cni_conf_dir: Path = DEFAULT_CNI_CONF_DIR
    socket_path: Path = Path(DEFAULT_SOCKET)
    state_dir: Path = DEFAULT_STATE_DIR
    ipam_dir: Path = DEFAULT_IPAM_DIR
    network_name: str = DEFAULT_NETWORK_NAME
    pod_namespace: str = "default"  # for pods whose runtime sends no K8S_POD_NAMESPACE
    resync_period: float = DEFAULT_RESYNC_PERIOD

    @property
    def conflist_path(self) -> Path:
        """The CNI config list the agent writes for runtimes."""
        return self.cni_conf_dir / f"10-{self.network_name}.conflist"

    def resolved_node_ip(self) -> IPv4Address:
        """The configured node IP, or the one detected in this network namespace."""
        return self.node_ip if self.node_ip is not None else detect_node_ip()


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
    """The default-route interface's first global IPv4 address, else any global one."""
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
