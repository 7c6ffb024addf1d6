"""Who may send this node VXLAN: each peer node's underlay address and, where it can be
checked, its underlay MAC (pure; ``linux`` and ``ovs`` apply it).

The kernel (and OVS) decapsulates any VXLAN datagram that reaches the tunnel port and
believes the inner source address, so the outer datagram must come from a peer node. An
address alone is easy to forge for any host on the underlay; the outer Ethernet source is
a second thing it must forge. A peer's MAC is checked when it is known and meaningful:

- the peer published it (its Node's ``podnet.io/underlay-mac``, copied by the master to
  its HostSubnet; ``RemoteNode.mac``). A peer that did not (an agent from before the
  annotation, during a rolling upgrade) is accepted on its address alone, and the agent
  logs a warning naming it, so an upgrade never cuts a node off;
- the peer is on one of the underlay's connected subnets. Across a router the outer
  source MAC is the router's, so such a peer is accepted on its address alone too.

``VtepPeer.mac`` None means "address alone". The same values give the nftables sets, the
static neighbour entries (``linux``) and br-phy's flows (``ovs``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from podnet.dataplane.interface import NodeNetwork, RemoteNode
from podnet.dataplane.wiring import usable_remotes


@dataclass(frozen=True)
class VtepPeer:
    """One peer node's tunnel endpoint: its node IP and the source MAC its VXLAN must
    carry (None: accepted on the address alone)."""

    ip: IPv4Address
    mac: str | None = None

    def pair(self) -> str:
        """The ``ipv4_addr . ether_addr`` set element, as ``nft`` prints it."""
        return f"{self.ip} . {self.mac}"


def vtep_peers(
    node: NodeNetwork, remotes: Iterable[RemoteNode], underlay: Iterable[IPv4Network]
) -> frozenset[VtepPeer]:
    """The peers of ``node`` (the usable remotes; none with host-gw), each with its MAC
    when it published one and its node IP is on a subnet of ``underlay`` (the underlay
    interface's connected subnets)."""
    if node.tunnel != "vxlan":
        return frozenset()
    nets = list(underlay)
    return frozenset(
        VtepPeer(r.node_ip, r.mac if r.mac and any(r.node_ip in n for n in nets) else None)
        for r in usable_remotes(node, remotes)
    )


def by_ip(peers: Iterable[VtepPeer]) -> list[VtepPeer]:
    """Peers sorted by address (a stable order for rendering)."""
    return sorted(peers, key=lambda p: (p.ip, p.mac or ""))


def with_mac(peers: Iterable[VtepPeer]) -> list[VtepPeer]:
    """The peers whose MAC is checked, by address."""
    return [p for p in by_ip(peers) if p.mac is not None]


def ip_only(peers: Iterable[VtepPeer]) -> list[VtepPeer]:
    """The peers accepted on their address alone, by address."""
    return [p for p in by_ip(peers) if p.mac is None]


def unpublished(remotes: Iterable[RemoteNode]) -> list[str]:
    """Names of remotes that published no underlay MAC (their VXLAN is checked by
    address alone), sorted."""
    return sorted(r.name for r in remotes if not r.mac)
