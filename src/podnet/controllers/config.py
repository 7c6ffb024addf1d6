"""The master's network configuration rules: what may change in the running ClusterNetwork.

The configuration itself (``NetworkConfig``, the plugin names, ClusterNetwork entries) is a
model, ``podnet.model.network``; it is re-exported here for the controllers and the master.
``change_errors`` states OpenShift's change rules (grow to a superset only;
hostSubnetLength, serviceNetwork and vxlanPort are fixed) so the master can refuse a bad
change with a clear message before it writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from podnet.model.network import (
    API_VERSION,
    CLUSTER_NETWORK_NAME,
    DEFAULT_CLUSTER_NETWORK,
    DEFAULT_MTU,
    DEFAULT_SERVICE_NETWORK,
    DEFAULT_VXLAN_PORT,
    MULTITENANT,
    NETWORKPOLICY,
    PLUGIN_ALIASES,
    PLUGINS,
    SUBNET,
    ClusterNetworkEntry,
    NetworkConfig,
    parse_cluster_network_flag,
    parse_cluster_networks,
    plugin_name,
    uses_vnids,
)

__all__ = [
    "API_VERSION",
    "CLUSTER_NETWORK_NAME",
    "DEFAULT_CLUSTER_NETWORK",
    "DEFAULT_MTU",
    "DEFAULT_SERVICE_NETWORK",
    "DEFAULT_VXLAN_PORT",
    "MULTITENANT",
    "NETWORKPOLICY",
    "PLUGINS",
    "PLUGIN_ALIASES",
    "SUBNET",
    "ClusterNetworkEntry",
    "NetworkConfig",
    "change_errors",
    "covers",
    "entry_change_errors",
    "parse_cluster_network_flag",
    "parse_cluster_networks",
    "plugin_name",
    "uses_vnids",
]


def covers(new: Sequence[ClusterNetworkEntry], old: Sequence[ClusterNetworkEntry]) -> bool:
    """Whether every old entry lies inside a new entry with the same hostSubnetLength."""
    return not entry_change_errors(old, new)


def entry_change_errors(
    old: Sequence[ClusterNetworkEntry], new: Sequence[ClusterNetworkEntry]
) -> list[str]:
    """Why ``new`` entries are not a permitted grow of ``old`` ones (empty when they are)."""
    errors = []
    for entry in old:
        home = next((n for n in new if entry.cidr.subnet_of(n.cidr)), None)
        if home is None:
            errors.append(f"{entry.cidr} may not shrink or go: the network may only grow")
        elif home.host_subnet_length != entry.host_subnet_length:
            errors.append(f"hostSubnetLength of {entry.cidr} may not change")
    for i, entry in enumerate(new):
        errors += [
            f"{entry.cidr} overlaps {other.cidr}"
            for other in new[:i]
            if entry.cidr.overlaps(other.cidr)
        ]
    return errors


def change_errors(old: NetworkConfig, new: NetworkConfig) -> list[str]:
    """Why changing the running network ``old`` into ``new`` is refused (empty when allowed)."""
    errors = entry_change_errors(old.cluster_networks, new.cluster_networks)
    if old.service_network != new.service_network:
        errors.append(f"serviceNetwork may not change (is {old.service_network})")
    if old.vxlan_port != new.vxlan_port:
        errors.append(f"vxlanPort may not change (is {old.vxlan_port})")
    return errors
