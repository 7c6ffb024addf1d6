"""The service proxy as one nftables table, rendered from a ``ServiceTable`` (pure).

``table ip podnet_services``, modelled on kube-proxy's nftables mode:

- ``services`` (from the nat hooks ``prerouting`` and ``output``, priority dstnat) does one
  lookup in the verdict map ``service_ips``, keyed by ``ip daddr . meta l4proto . th
  dport`` (cluster IPs and external IPs), and for addresses of this node (``fib daddr
  type local``, and every other node's, so that a pod's packet to another node's port
  is DNATed here with the pod's address) one in ``node_ports``, keyed by protocol and
  port. Each element jumps to the chain of one service port, so the per-packet cost does
  not grow with services.
- ``svc/<ns>/<name>/<proto>/<port>/<digest>`` (cluster IP) marks traffic from outside
  the cluster network for masquerade, then picks a number at random (``numgen random
  mod <endpoints>``, into the conntrack mark) and DNATs through the ``endpoints`` map,
  keyed by ``ip daddr . meta l4proto . th dport . ct mark``, whose elements are the
  service port's endpoints (``serviceports``): equal weight, and an endpoint change is a
  change of map elements only. Each group's count and digest are kept in the set
  ``endpoint_digests``, which is read back instead of the map's 50,000 elements. Service
  chains are named by their content, so a new number of endpoints adds a chain and
  repoints one map element, and the table is read back from its chain names, map
  elements and digests alone (``services.read_table``). ``ext/...`` (node port,
  external IPs: the map is keyed by the cluster IP, so these pick by one rule per
  endpoint, ``choose``) DNATs to any endpoint under externalTrafficPolicy Cluster,
  masqueraded (the reply must come back through this node); under Local it keeps the
  source, uses local endpoints only and drops when there are none (the node does not
  answer). This node's own pods, and with isolation other
  nodes' pods, are treated apart so that isolation holds (``external_rules``).
- Session affinity (ClientIP): one endpoint chain per endpoint that records the client
  in a set with the service's timeout (``update @aff/...``) and DNATs; the service chain
  first sends a client found in an endpoint's set to that endpoint, then picks one by a
  rule per endpoint.
- A service port without endpoints is not DNATed: its cluster IP and node port are in
  ``no_endpoint_ips`` / ``no_endpoint_node_ports``, which the filter hooks (input,
  forward, output, just before the policy table) answer with a TCP reset or an ICMP
  port unreachable. Nothing is black-holed.
- ``postrouting`` masquerades what was marked, hairpin traffic (a pod reaching itself
  through a service: source == endpoint, ``@hairpin``; the forward filter marks the
  first packet, so that the policy table lets it pass as loopback, as ``evaluate`` does;
  later packets pass its ``ct state established,related accept``) and,
  when bridged traffic skips netfilter (subnet mode: ``NodeNetwork.isolation`` off),
  DNATed traffic between two pods of this node, whose reply would otherwise be bridged
  around conntrack.

DNAT happens in prerouting and output, before the forward filter: the policy table
(``inet podnet_policy``) and the tunnel guard see the chosen endpoint as the
destination, so isolation and NetworkPolicy apply to a service as to its endpoints.
A pod's packet to a service goes to its gateway (br0's address), so it is routed, not
bridged, and passes these hooks in every mode.

Per packet, an established connection costs conntrack, the NAT rewrite and one rule of
the forward filter (``ct state != new``). In subnet mode a service connection between pods
of one node is also routed through the node both ways (the masquerade brings the
replies back), where traffic to the endpoint's own IP is only bridged. With isolation,
br_netfilter DNATs it within the bridge. (A flowtable would shortcut the routed path,
but kernels built without ``CONFIG_NF_FLOW_TABLE`` have none.)

Everything is rendered in the form ``nft list table`` prints, so the table read back
from the kernel compares equal to the rendered one (``servicescript``). The shared
chains carry a digest of their rules as their comment, so that reading back needs no
rule at all: chain names and comments, and the sets' elements.

Marks: meta mark 0x4000 asks postrouting to masquerade, 0x8000 marks hairpin traffic
for the policy table; the conntrack mark of a new service connection holds the
endpoint pick.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Mapping

from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux import servicenft as nft
from podnet.dataplane.linux.nftrules import collapse
from podnet.dataplane.linux.policyvalues import HAIRPIN_MARK
from podnet.dataplane.linux.servicenft import (
    Chain,
    EndpointGroup,
    NftSet,
    PortParts,
    ServiceNft,
    Touched,
    digest,
)
from podnet.dataplane.linux.serviceports import port_parts
from podnet.services.model import ServicePort, ServiceTable

NEW_ONLY = f"ct state new jump {nft.CHECK_CHAIN}"
# Every later packet of a connection passes the forward filter on its first rule: the
# endpoint check and the hairpin mark (read by the policy table only before its own
# ``ct state established,related accept``) matter to a connection's first packet only.
ESTABLISHED = "ct state != new accept"
CHECK = f"jump {nft.CHECK_CHAIN}"
SERIALS = itertools.count(1)  # renders are numbered across renderers: a serial is unique


class ServiceRenderer:
    """Renders tables for one node, incrementally: only the ports that changed since the
    last render (by identity, then value) are rendered and swapped in; when the keys are
    where they were (the compiler keeps unchanged ports), found walking both side by side."""

    def __init__(self, node: NodeNetwork) -> None:
        self.node = node
        self._ports: dict[str, ServicePort] = {}
        self._parts: dict[str, PortParts] = {}
        self._chains: dict[str, Chain] = dict(fixed_chains(node))
        self._sets: dict[str, NftSet] = {}
        self._elements: dict[str, Counter[str]] = {}
        self._groups: dict[str, EndpointGroup] = {}
        self._frozen: dict[str, frozenset[str]] = {}  # the elements of each set, as rendered
        self._udp: Counter[tuple[str, int]] = Counter()  # UDP endpoints, per port using them
        self._last: tuple[ServicePort, ...] = ()  # the ports last rendered
        self._serial: int | None = None  # of the last render
        self._touched: tuple[set[str], set[str], set[str]] = (set(), set(), set())

    def render(self, table: ServiceTable) -> ServiceNft:
        """The nftables table for ``table`` (empty value: no table at all)."""
        changes, self._last = self._changes(table.ports), ()  # () until all are in
        for key, _ in changes:  # every port out first: an endpoint group is keyed by
            if key in self._ports:  # address, protocol and port, which a port coming in
                self._take_out(key)  # may share with one going out (same cluster IP)
        for key, port in changes:
            if port is not None:
                self._put_in(key, port)
        self._last = table.ports
        sets = self._touched[1]
        for name in sets & self._elements.keys():
            self._frozen[name] = frozenset(self._elements[name])  # the counter's keys
        nodes = frozenset(str(ip) for ip in table.node_ips)
        if nodes != self._frozen.get(nft.NODE_IPS):
            self._frozen[nft.NODE_IPS] = nodes
            sets.add(nft.NODE_IPS)
        since, self._serial = self._serial, next(SERIALS)
        touched = None if since is None else Touched(since, *map(frozenset, self._touched))
        self._touched = (set(), set(), set())
        if not table.ports:
            return ServiceNft(serial=self._serial, touched=touched)
        found = dict(self._sets)
        for fixed in fixed_sets(self.node, self._frozen):
            found[fixed.name] = fixed
        return ServiceNft(found, dict(self._chains), dict(self._groups), self._serial, touched)

    def udp_endpoints(self) -> frozenset[tuple[str, int]]:
        """The UDP endpoints (address, port) last rendered (for the conntrack flush)."""
        return frozenset(self._udp)

    def _changes(self, ports: tuple[ServicePort, ...]) -> list[tuple[str, ServicePort | None]]:
        """(key, new port or None: gone) of every port that differs from the last render."""
        if len(self._last) == len(ports):
            pairs = [(a, b) for a, b in zip(self._last, ports, strict=True) if a is not b]
            if all(a.key == b.key for a, b in pairs):
                return [(b.key, b) for a, b in pairs if a != b]
        wanted: dict[str, ServicePort | None] = {p.key: p for p in ports}
        gone = {key: None for key in self._ports if key not in wanted}
        return [(k, p) for k, p in {**wanted, **gone}.items() if p is not self._ports.get(k) != p]

    def _put_in(self, key: str, port: ServicePort) -> None:
        part = port_parts(port, self.node)
        self._ports[key], self._parts[key] = port, part
        self._chains.update((c.name, c) for c in part.chains)
        self._sets.update((s.name, s) for s in part.sets)
        for name, element in part.elements:
            self._elements.setdefault(name, Counter())[element] += 1
        self._groups.update(part.groups)
        self._touch(part)
        if port.protocol == "udp":
            self._udp.update((str(e.ip), e.port) for e in port.endpoints)

    def _take_out(self, key: str) -> None:
        port = self._ports.pop(key)
        part = self._parts.pop(key)
        for chain in part.chains:
            self._chains.pop(chain.name, None)
        for found in part.sets:
            self._sets.pop(found.name, None)
        for prefix, _ in part.groups:
            self._groups.pop(prefix, None)
        self._touch(part)
        for name, element in part.elements:
            counts = self._elements[name]
            counts[element] -= 1
            if counts[element] <= 0:
                del counts[element]
        for udp in [(str(e.ip), e.port) for e in port.endpoints if port.protocol == "udp"]:
            self._udp[udp] -= 1
            if self._udp[udp] <= 0:
                del self._udp[udp]

    def _touch(self, part: PortParts) -> None:
        chains, sets, groups = self._touched
        chains.update(c.name for c in part.chains)
        sets.update(s.name for s in part.sets)
        sets.update(name for name, _ in part.elements)
        groups.update(prefix for prefix, _ in part.groups)


def fixed_sets(node: NodeNetwork, elements: Mapping[str, frozenset[str]]) -> list[NftSet]:
    """The table's own sets and maps, holding the elements the ports gave."""
    cluster = frozenset(str(n) for n in collapse(node.cluster_networks))

    def of(name: str) -> frozenset[str]:
        return elements.get(name, frozenset())

    return [
        NftSet(nft.CLUSTER_NETWORKS, "ipv4_addr", "interval", elements=cluster),
        NftSet(nft.HAIRPIN, "ipv4_addr . ipv4_addr", elements=of(nft.HAIRPIN)),
        NftSet(nft.NODE_IPS, "ipv4_addr", elements=of(nft.NODE_IPS)),
        NftSet(nft.SERVICE_IPS, f"{nft.ADDRESS_KEY} : verdict", elements=of(nft.SERVICE_IPS)),
        NftSet(nft.NODE_PORTS, f"{nft.PORT_KEY} : verdict", elements=of(nft.NODE_PORTS)),
        NftSet(
            nft.NO_ENDPOINT_IPS, f"{nft.ADDRESS_KEY} : verdict", elements=of(nft.NO_ENDPOINT_IPS)
        ),
        NftSet(
            nft.NO_ENDPOINT_NODE_PORTS,
            f"{nft.PORT_KEY} : verdict",
            elements=of(nft.NO_ENDPOINT_NODE_PORTS),
        ),
        NftSet(nft.ENDPOINTS, f"{nft.PICK_KEY} : {nft.TARGET}", elements=None),  # by group
        NftSet(nft.ENDPOINT_DIGESTS, f"{nft.PICK_KEY} . mark", elements=of(nft.ENDPOINT_DIGESTS)),
    ]


def fixed_chains(node: NodeNetwork) -> list[tuple[str, Chain]]:
    """Base chains and the shared regular chains."""
    nat = "type nat hook {} priority {}; policy accept;"
    filt = "type filter hook {} priority filter - 1; policy accept;"
    local = f"ip saddr {node.subnet} ip daddr {node.subnet} ct status dnat masquerade"
    hairpin = f"ct status dnat ip saddr . ip daddr @{nft.HAIRPIN}"
    mark_hairpin = f"{hairpin} meta mark set meta mark | {HAIRPIN_MARK}"
    postrouting = [
        f"meta mark & {nft.MASQUERADE_MARK} == {nft.MASQUERADE_MARK} masquerade",
        f"{hairpin} masquerade",
        *([] if node.isolation else [local]),
    ]
    chains = [
        Chain("prerouting", nat.format("prerouting", "dstnat"), (f"jump {nft.SERVICES_CHAIN}",)),
        Chain("output", nat.format("output", "-100"), (f"jump {nft.SERVICES_CHAIN}",)),
        Chain("postrouting", nat.format("postrouting", "srcnat"), tuple(postrouting)),
        Chain("filter_input", filt.format("input"), (NEW_ONLY,)),
        Chain("filter_forward", filt.format("forward"), (ESTABLISHED, mark_hairpin, CHECK)),
        Chain("filter_output", filt.format("output"), (NEW_ONLY,)),
        Chain(
            nft.SERVICES_CHAIN,
            None,
            (
                f"ip daddr . meta l4proto . th dport vmap @{nft.SERVICE_IPS}",
                f"fib daddr type local meta l4proto . th dport vmap @{nft.NODE_PORTS}",
                f"ip daddr @{nft.NODE_IPS} meta l4proto . th dport vmap @{nft.NODE_PORTS}",
            ),
        ),
        Chain(
            nft.CHECK_CHAIN,
            None,
            (
                f"ip daddr . meta l4proto . th dport vmap @{nft.NO_ENDPOINT_IPS}",
                f"fib daddr type local meta l4proto . th dport vmap @{nft.NO_ENDPOINT_NODE_PORTS}",
            ),
        ),
        Chain(nft.REJECT_CHAIN, None, ("reject with tcp reset", "reject")),
    ]
    return [(c.name, dataclasses.replace(c, comment=digest(c.rules))) for c in chains]
