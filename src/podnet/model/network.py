"""The cluster network as a model: the network plugin names, and the network configuration
with its stored form, the ClusterNetwork ``default``. Pure data, no I/O.

``NetworkConfig`` is what the operator asks for (``podnet master`` flags); the
ClusterNetwork object is what the cluster runs with. The plugin names (OpenShift's) decide
how pods are isolated: ``uses_vnids`` is true for the two that give every project a VNID.
The rules for changing a running network are the master's: ``podnet.controllers.config``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Any

SUBNET = "redhat/openshift-ovs-subnet"
MULTITENANT = "redhat/openshift-ovs-multitenant"
NETWORKPOLICY = "redhat/openshift-ovs-networkpolicy"
PLUGINS = (SUBNET, MULTITENANT, NETWORKPOLICY)
# Short names accepted by the master's --network-plugin flag.
PLUGIN_ALIASES = {"subnet": SUBNET, "multitenant": MULTITENANT, "networkpolicy": NETWORKPOLICY}

CLUSTER_NETWORK_NAME = "default"
API_VERSION = "network.openshift.io/v1"
DEFAULT_CLUSTER_NETWORK = "10.128.0.0/14:9"
DEFAULT_SERVICE_NETWORK = "172.30.0.0/16"
DEFAULT_VXLAN_PORT = 4789
DEFAULT_MTU = 1450


def uses_vnids(plugin: str) -> bool:
    """Whether the plugin gives every project a VNID (multitenant and networkpolicy)."""
    return plugin in (MULTITENANT, NETWORKPOLICY)


def plugin_name(value: str) -> str:
    """The full plugin name for a full or short name (``multitenant``); ValueError if unknown."""
    full = PLUGIN_ALIASES.get(value, value)
    if full not in PLUGINS:
        raise ValueError(f"unknown network plugin {value!r}: expected one of {', '.join(PLUGINS)}")
    return full


@dataclass(frozen=True, order=True)
class ClusterNetworkEntry:
    """One ``clusterNetworks[]`` entry: a CIDR cut into subnets of 2^host_subnet_length."""

    cidr: IPv4Network
    host_subnet_length: int

    def __post_init__(self) -> None:
        top = 32 - self.cidr.prefixlen
        if not 2 <= self.host_subnet_length <= top:
            raise ValueError(
                f"hostSubnetLength {self.host_subnet_length} does not fit {self.cidr} "
                f"(must be 2..{top})"
            )

    @property
    def subnet_prefixlen(self) -> int:
        """Prefix length of each host subnet (a hostSubnetLength of 9 gives /23)."""
        return 32 - self.host_subnet_length

    @property
    def subnet_count(self) -> int:
        """How many host subnets the entry holds."""
        return 1 << (self.subnet_prefixlen - self.cidr.prefixlen)

    def to_object(self) -> dict[str, Any]:
        """The ``clusterNetworks[]`` entry."""
        return {"CIDR": str(self.cidr), "hostSubnetLength": self.host_subnet_length}

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterNetworkEntry:
        """Read a ``clusterNetworks[]`` entry."""
        return cls(IPv4Network(obj["CIDR"]), int(obj["hostSubnetLength"]))

    def __str__(self) -> str:
        return f"{self.cidr}:{self.host_subnet_length}"


def parse_cluster_network_flag(value: str) -> ClusterNetworkEntry:
    """Parse ``CIDR:hostSubnetLength`` (``10.128.0.0/14:9``); ValueError with a clear message."""
    cidr, sep, length = value.strip().rpartition(":")
    if not sep or not length.isdigit():
        raise ValueError(f"cluster network {value!r}: expected CIDR:hostSubnetLength")
    try:
        network = IPv4Network(cidr)
    except ValueError as exc:
        raise ValueError(f"cluster network {value!r}: {exc}") from exc
    return ClusterNetworkEntry(network, int(length))


def parse_cluster_networks(values: Iterable[str]) -> list[ClusterNetworkEntry]:
    """Parse several flags, each possibly a comma-separated list of ``CIDR:length``."""
    return [parse_cluster_network_flag(v) for value in values for v in value.split(",") if v]


@dataclass
class NetworkConfig:
    """What the master runs with: the fields of the ClusterNetwork ``default``."""

    cluster_networks: list[ClusterNetworkEntry]
    service_network: IPv4Network
    plugin_name: str
    vxlan_port: int = DEFAULT_VXLAN_PORT
    mtu: int = DEFAULT_MTU

    @classmethod
    def default(cls, plugin: str = SUBNET) -> NetworkConfig:
        """OpenShift's defaults: 10.128.0.0/14 with /23 per node, services 172.30.0.0/16."""
        return cls(
            [parse_cluster_network_flag(DEFAULT_CLUSTER_NETWORK)],
            IPv4Network(DEFAULT_SERVICE_NETWORK),
            plugin_name(plugin),
        )

    def to_object(self) -> dict[str, Any]:
        """The ClusterNetwork ``default`` this configuration describes."""
        return {
            "apiVersion": API_VERSION,
            "kind": "ClusterNetwork",
            "metadata": {"name": CLUSTER_NETWORK_NAME},
            "clusterNetworks": [e.to_object() for e in self.cluster_networks],
            "serviceNetwork": str(self.service_network),
            "pluginName": self.plugin_name,
            "vxlanPort": self.vxlan_port,
            "mtu": self.mtu,
        }

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NetworkConfig:
        """Read a stored ClusterNetwork (missing optional fields take their defaults)."""
        return cls(
            [ClusterNetworkEntry.from_object(e) for e in obj.get("clusterNetworks") or []],
            IPv4Network(obj["serviceNetwork"]),
            str(obj.get("pluginName") or SUBNET),
            int(obj.get("vxlanPort") or DEFAULT_VXLAN_PORT),
            int(obj.get("mtu") or DEFAULT_MTU),
        )

    def describe(self) -> str:
        """One line for logs and errors."""
        nets = ",".join(str(e) for e in self.cluster_networks)
        return (
            f"clusterNetworks={nets} serviceNetwork={self.service_network} "
            f"plugin={self.plugin_name} vxlanPort={self.vxlan_port} mtu={self.mtu}"
        )
