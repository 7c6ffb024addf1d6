"""What every data plane decides the same way, whatever it programs: the name of a pod's
veth host end, and which remote nodes to route to (pure).

``linux`` (``linux.desired`` re-exports these) and ``ovs`` share them, so a pod's host end
has one name and both implementations pick the same remotes from the same HostSubnets.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from ipaddress import IPv4Network

from podnet.dataplane.interface import NodeNetwork, RemoteNode

HOST_VETH_PREFIX = "pn"


def host_veth_name(container_id: str, ifname: str) -> str:
    """The host end of a pod's veth: ``pn`` + 12 hex of a hash (14 chars, ≤ IFNAMSIZ-1)."""
    digest = hashlib.sha256(f"{container_id}\0{ifname}".encode()).hexdigest()
    return HOST_VETH_PREFIX + digest[:12]


def is_host_veth_name(name: str) -> bool:
    """True for names ``host_veth_name`` produces."""
    return re.fullmatch(rf"{HOST_VETH_PREFIX}[0-9a-f]{{12}}", name) is not None


def usable_remotes(node: NodeNetwork, remotes: Iterable[RemoteNode]) -> list[RemoteNode]:
    """Remotes sorted by name, without this node and without a second claim to a subnet
    (a stale HostSubnet): the first by name wins, so the result is deterministic."""
    chosen: dict[IPv4Network, RemoteNode] = {}
    for remote in sorted(remotes, key=lambda r: r.name):
        if remote.name == node.node_name or remote.subnet.overlaps(node.subnet):
            continue
        if remote.node_ip == node.node_ip:
            continue
        chosen.setdefault(remote.subnet, remote)
    return list(chosen.values())


def non_adjacent(remotes: Iterable[RemoteNode], underlay: Iterable[IPv4Network]) -> list[str]:
    """Names of remotes whose node IP is on none of the underlay's connected subnets."""
    nets = list(underlay)
    return [r.name for r in remotes if not any(r.node_ip in net for net in nets)]
