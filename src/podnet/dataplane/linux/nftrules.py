"""podnet's two nftables tables for a node, rendered in the exact form ``nft list table``
prints, so the same text is applied and compared (pure: nothing here touches the kernel).

- ``inet podnet``: masquerade of pod traffic leaving the cluster, the tunnel's guard
  (VXLAN only from peers on the underlay, with the peer's MAC where it is known; pods kept
  off every node's tunnel port), and the DNS's per-source UDP rate (``_dns_limit``).
- ``bridge podnet``: per-pod anti-spoofing over one set of (host veth, MAC, IP).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Network, collapse_addresses

from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux.desired import (
    HOST_VETH_PREFIX,
    NFT_TABLE,
    POD_PORTS_SET,
    VTEP_IP_ONLY_SET,
    VTEP_MACS_SET,
    VTEP_PEERS_SET,
    PodPort,
)
from podnet.dataplane.vteppeers import VtepPeer, by_ip, ip_only, with_mac

DNS_CLIENTS_SET = "dns_clients"  # the DNS rate meter's entries, one per source address
DNS_CLIENTS_MAX = 65535  # sources metered at once (a node's subnet holds far fewer pods)


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
    peers: Iterable[VtepPeer] = (),
) -> Ruleset:
    """The node's tables: NAT and the tunnel's guard (inet), anti-spoofing (bridge)."""
    return Ruleset(inet=render_inet_table(node, underlay, peers), bridge=render_bridge_table(ports))


def render_inet_table(node: NodeNetwork, underlay: str, peers: Iterable[VtepPeer] = ()) -> str:
    """Masquerade pod traffic that leaves the cluster and service networks; guard the
    tunnel port (``_tunnel_chains``). ``peers`` is ignored with host-gw (no tunnel)."""
    cluster = list(collapse(node.cluster_networks))
    internal = list(collapse((*node.cluster_networks, node.service_network)))
    sets = [
        _set("cluster_networks", "ipv4_addr", [str(n) for n in cluster], interval=True),
        _set("no_masquerade", "ipv4_addr", [str(n) for n in internal], interval=True),
    ]
    if node.tunnel == "vxlan":
        sets += _peer_sets(by_ip(set(peers)))
    if node.dns_client_qps is not None:
        sets.append(_kernel_filled_set(DNS_CLIENTS_SET, "ipv4_addr", DNS_CLIENTS_MAX, "1m"))
    postrouting = _chain(
        "postrouting",
        "type nat hook postrouting priority srcnat; policy accept;",
        ["ip saddr @cluster_networks ip daddr != @no_masquerade masquerade"],
    )
    return _table("inet", [*sets, *_tunnel_chains(node, underlay), postrouting])


def _peer_sets(peers: list[VtepPeer]) -> list[str]:
    """Every peer's address; the (address, MAC) pairs that must match; the addresses
    accepted alone (no MAC published, or not on the underlay's subnets)."""
    return [
        _set(VTEP_PEERS_SET, "ipv4_addr", [str(p.ip) for p in peers], interval=False),
        _set(VTEP_MACS_SET, "ipv4_addr . ether_addr", [p.pair() for p in with_mac(peers)]),
        _set(VTEP_IP_ONLY_SET, "ipv4_addr", [str(p.ip) for p in ip_only(peers)]),
    ]


def _tunnel_chains(node: NodeNetwork, underlay: str) -> list[str]:
    """Who may reach the tunnel port. The kernel decapsulates any UDP datagram that
    reaches vxlan0's port and trusts the inner source address, so:

    - input: only a peer's underlay address, arriving on the underlay interface (not
      from a pod on br0, not nested inside the tunnel on vxlan0, no IPv6, not an outside
      host), and with that peer's MAC as the Ethernet source unless the peer is accepted
      by address alone (``vteppeers``); anything else to the port is dropped;
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
    dns = _dns_limit(node)
    if node.tunnel != "vxlan":
        guard = [f"ip saddr @cluster_networks udp dport {port} drop", *dns]
        hook = "type filter hook input priority filter; policy accept;"
        return [_chain("input", hook, guard), keep_pods_off]
    ip = node.node_ip
    guard = [
        f'udp dport {port} iifname != "{underlay}" drop',
        f"udp dport {port} ip saddr != @{VTEP_PEERS_SET} drop",
        f"udp dport {port} ip saddr != @{VTEP_IP_ONLY_SET} "
        f"ip saddr . ether saddr != @{VTEP_MACS_SET} drop",
        f"meta nfproto ipv6 udp dport {port} drop",
        f"ip daddr {ip} udp dport {port} accept",
        *dns,
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


def _dns_limit(node: NodeNetwork) -> list[str]:
    """The DNS's per-client UDP rate, enforced where it is cheap: each source's queries
    to the gateway's DNS port beyond ``dns_client_qps`` (with ``dns_client_burst`` packets
    saved) are dropped by the kernel, before they reach the DNS socket. A flooding pod
    then cannot fill that socket's queue, which is shared by every pod, whatever CPU the
    DNS thread gets. The DNS's own buckets still apply below this rate (the tighter one
    for uncached names) and to TCP. One meter entry per source, in a set the kernel fills
    and expires (``dns_clients``); only sources of the node's pod subnet, the only ones
    the DNS answers, so forged outside sources cannot fill the set. None when the node
    serves no DNS."""
    if node.dns_client_qps is None:
        return []
    rate = max(1, math.ceil(node.dns_client_qps))
    burst = max(rate, node.dns_client_burst)
    meter = f"{{ ip saddr limit rate over {rate}/second burst {burst} packets }}"
    return [
        f"ip saddr {node.subnet} ip daddr {node.gateway.ip} udp dport {node.dns_port} "
        f"update @{DNS_CLIENTS_SET} {meter} counter drop"
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


def _set(name: str, type_: str, elements: list[str], *, interval: bool = False) -> str:
    lines = [f"\tset {name} {{", f"\t\ttype {type_}"]
    if interval:
        lines.append("\t\tflags interval")
    if elements:
        lines.append("\t\telements = { " + ",\n\t\t\t     ".join(elements) + " }")
    return "\n".join([*lines, "\t}"])


def _kernel_filled_set(name: str, type_: str, size: int, timeout: str) -> str:
    """A set whose elements the kernel adds and expires (a meter): none are rendered,
    and the comparison with the listed table leaves them out (``nftables.table_view``)."""
    lines = [f"\tset {name} {{", f"\t\ttype {type_}", f"\t\tsize {size}"]
    lines += ["\t\tflags dynamic,timeout", f"\t\ttimeout {timeout}", "\t}"]
    return "\n".join(lines)


def _chain(name: str, hook: str | None, rules: list[str]) -> str:
    lines = [f"\tchain {name} {{"]
    if hook:
        lines.append(f"\t\t{hook}")
    lines.extend(f"\t\t{rule}" for rule in rules)
    return "\n".join([*lines, "\t}"])
