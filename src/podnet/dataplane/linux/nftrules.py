"""podnet's two nftables tables for a node, rendered in the exact form ``nft list table``
prints, so the same text is applied and compared (pure: nothing here touches the kernel).

- ``inet podnet``: masquerade of pod traffic leaving the cluster, and the tunnel's guard
  (VXLAN only from peers on the underlay; pods kept off every node's tunnel port).
- ``bridge podnet``: per-pod anti-spoofing over one set of (host veth, MAC, IP).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, collapse_addresses

from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux.desired import (
    HOST_VETH_PREFIX,
    NFT_TABLE,
    POD_PORTS_SET,
    VTEP_PEERS_SET,
    PodPort,
)


@dataclass(frozen=True)
class Ruleset:
    """podnet's two nftables tables, each as ``nft list table`` prints it."""

    inet: str
    bridge: str

    def tables(self) -> dict[str, str]:
        """Table text keyed by ``"<family> <name>"``."""
        return {f"inet {NFT_TABLE}": self.inet, f"bridge {NFT_TABLE}": self.bridge}


def render_ruleset(
    node: NodeNetwork,
    ports: Iterable[PodPort],
    underlay: str,
    peers: Iterable[IPv4Address] = (),
) -> Ruleset:
    """The node's tables: NAT and the tunnel's guard (inet), anti-spoofing (bridge)."""
    return Ruleset(inet=render_inet_table(node, underlay, peers), bridge=render_bridge_table(ports))


def render_inet_table(node: NodeNetwork, underlay: str, peers: Iterable[IPv4Address] = ()) -> str:
    """Masquerade pod traffic that leaves the cluster and service networks; guard the
    tunnel port (``_tunnel_chains``). ``peers`` is ignored with host-gw (no tunnel)."""
    cluster = list(collapse(node.cluster_networks))
    internal = list(collapse((*node.cluster_networks, node.service_network)))
    sets = [
        _set("cluster_networks", "ipv4_addr", [str(n) for n in cluster], interval=True),
        _set("no_masquerade", "ipv4_addr", [str(n) for n in internal], interval=True),
    ]
    if node.tunnel == "vxlan":
        elements = [str(p) for p in sorted(set(peers))]
        sets.append(_set(VTEP_PEERS_SET, "ipv4_addr", elements, interval=False))
    postrouting = _chain(
        "postrouting",
        "type nat hook postrouting priority srcnat; policy accept;",
        ["ip saddr @cluster_networks ip daddr != @no_masquerade masquerade"],
    )
    return _table("inet", [*sets, *_tunnel_chains(node, underlay), postrouting])


def _tunnel_chains(node: NodeNetwork, underlay: str) -> list[str]:
    """Who may reach the tunnel port. The kernel decapsulates any UDP datagram that
    reaches vxlan0's port and trusts the inner source address, so:

    - input: only a peer's underlay address, arriving on the underlay interface (not
      from a pod on br0, not nested inside the tunnel on vxlan0, no IPv6, not an outside
      host); anything else to the port is dropped;
    - forward: a pod's datagram to the port of anything outside the cluster network (a
      node's underlay address above all) is dropped here, before the masquerade in
      postrouting would give it this node's address, which every peer accepts. A pod's
      packets reach the node only by input (to the node) or forward (through it), so the
      two chains cover it before NAT and after (there is no path around forward).

    host-gw has no VXLAN device (nothing decapsulates); pods are kept off the port all
    the same, which costs nothing."""
    port = node.vxlan_port
    keep_pods_off = _chain(
        "forward",
        "type filter hook forward priority filter; policy accept;",
        # the port first: every forwarded packet (pod to pod across nodes, a pod's packet
        # to a service) meets this rule, and only UDP to the port needs the two lookups
        [f"udp dport {port} ip saddr @cluster_networks ip daddr != @cluster_networks drop"],
    )
    if node.tunnel != "vxlan":
        guard = [f"ip saddr @cluster_networks udp dport {port} drop"]
        hook = "type filter hook input priority filter; policy accept;"
        return [_chain("input", hook, guard), keep_pods_off]
    ip = node.node_ip
    guard = [
        f'udp dport {port} iifname != "{underlay}" drop',
        f"udp dport {port} ip saddr != @{VTEP_PEERS_SET} drop",
        f"meta nfproto ipv6 udp dport {port} drop",
        f"ip daddr {ip} udp dport {port} accept",
    ]
    return [
        _chain(
            "raw_prerouting",
            "type filter hook prerouting priority raw; policy accept;",
            [f"ip daddr {ip} udp dport {port} notrack"],
        ),
        _chain(
            "raw_output",
            "type filter hook output priority raw; policy accept;",
            [f"ip saddr {ip} udp dport {port} notrack"],
        ),
        _chain("input", "type filter hook input priority filter; policy accept;", guard),
        keep_pods_off,
    ]


def render_bridge_table(ports: Iterable[PodPort]) -> str:
    """Frames from a pod port (``pn*``) must carry that pod's MAC and IP, in IPv4 and in
    ARP (Ethernet source and sender hardware address both), or they are dropped. One set
    keeps the rule count constant however many pods there are."""
    elements = [p.element() for p in sorted(set(ports))]
    key = "iifname . ether saddr"
    body = [
        _set(POD_PORTS_SET, "ifname . ether_addr . ipv4_addr", elements, interval=False),
        _chain(
            "prerouting",
            "type filter hook prerouting priority filter; policy accept;",
            [f'iifname "{HOST_VETH_PREFIX}*" jump from_pod'],
        ),
        _chain(
            "from_pod",
            None,
            [
                f"{key} . ip saddr @{POD_PORTS_SET} accept",
                f"{key} . arp saddr ip @{POD_PORTS_SET} "
                f"iifname . arp saddr ether . arp saddr ip @{POD_PORTS_SET} accept",
                "drop",
            ],
        ),
    ]
    return _table("bridge", body)


def collapse(networks: Iterable[IPv4Network]) -> Iterable[IPv4Network]:
    """Networks merged and sorted (nft refuses overlapping interval elements)."""
    return collapse_addresses(sorted(set(networks)))


def _table(family: str, body: list[str]) -> str:
    return f"table {family} {NFT_TABLE} {{\n" + "\n\n".join(body) + "\n}\n"


def _set(name: str, type_: str, elements: list[str], *, interval: bool) -> str:
    lines = [f"\tset {name} {{", f"\t\ttype {type_}"]
    if interval:
        lines.append("\t\tflags interval")
    if elements:
        lines.append("\t\telements = { " + ",\n\t\t\t     ".join(elements) + " }")
    return "\n".join([*lines, "\t}"])


def _chain(name: str, hook: str | None, rules: list[str]) -> str:
    lines = [f"\tchain {name} {{"]
    if hook:
        lines.append(f"\t\t{hook}")
    lines.extend(f"\t\t{rule}" for rule in rules)
    return "\n".join([*lines, "\t}"])
