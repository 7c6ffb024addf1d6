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
  the cluster network for masquerade, then DNATs to an endpoint chosen by ``numgen
  random`` with equal weight (``choose``). Service chains are named by their content, so
  a change adds a chain and repoints one map element, and the table is read back from
  its chain names and map elements alone (``services.read_table``). ``ext/...`` (node
  port, external IPs) does the same under externalTrafficPolicy Cluster, masqueraded
  (the reply must come back through this node); under Local it keeps the source, uses
  local endpoints only and drops when there are none (the node does not answer). This
  node's own pods, and with isolation other nodes' pods, are treated apart so that
  isolation holds (``external_rules``).
- Session affinity (ClientIP): one endpoint chain per endpoint that records the client
  in a set with the service's timeout (``update @aff/...``) and DNATs; the service chain
  first sends a client found in an endpoint's set to that endpoint.
- A service port without endpoints is not DNATed: its cluster IP and node port are in
  ``no_endpoint_ips`` / ``no_endpoint_node_ports``, which the filter hooks (input,
  forward, output, just before the policy table) answer with a TCP reset or an ICMP
  port unreachable. Nothing is black-holed.
- ``postrouting`` masquerades what was marked, hairpin traffic (a pod reaching itself
  through a service: source == endpoint, ``@hairpin``; the forward filter marks it
  first, so that the policy table lets it pass as loopback, as ``evaluate`` does) and,
  when bridged traffic skips netfilter (subnet mode: ``NodeNetwork.isolation`` off),
  DNATed traffic between two pods of this node, whose reply would otherwise be bridged
  around conntrack.

DNAT happens in prerouting and output, before the forward filter: the policy table
(``inet podnet_policy``) and the tunnel guard see the chosen endpoint as the
destination, so isolation and NetworkPolicy apply to a service as to its endpoints.
A pod's packet to a service goes to its gateway (br0's address), so it is routed, not
bridged, and passes these hooks in every mode.

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
import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from podnet.dataplane.interface import NodeNetwork
from podnet.dataplane.linux.nftrules import collapse
from podnet.dataplane.linux.policytable import HAIRPIN_MARK
from podnet.services.model import Endpoint, ServicePort, ServiceTable

SERVICES_TABLE = "podnet_services"
TABLE_KEY = f"ip {SERVICES_TABLE}"
MASQUERADE_MARK = "0x00004000"
SERVICE_IPS, NODE_PORTS = "service_ips", "node_ports"
NO_ENDPOINT_IPS, NO_ENDPOINT_NODE_PORTS = "no_endpoint_ips", "no_endpoint_node_ports"
CLUSTER_NETWORKS, HAIRPIN, NODE_IPS = "cluster_networks", "hairpin", "node_ips"
ADDRESS_KEY = "ipv4_addr . inet_proto . inet_service"
PORT_KEY = "inet_proto . inet_service"
REJECT_CHAIN, CHECK_CHAIN, SERVICES_CHAIN = "reject_service", "endpoint_check", "services"
NEW_ONLY = f"ct state new jump {CHECK_CHAIN}"
MARK = f"meta mark set meta mark | {MASQUERADE_MARK}"


@dataclass(frozen=True)
class NftSet:
    """A named set or map. ``elements`` None: filled by the packet path (affinity)."""

    name: str
    type: str
    flags: str = ""
    timeout: int | None = None
    elements: frozenset[str] | None = frozenset()

    @property
    def kind(self) -> str:
        """``map`` (its type has a data part) or ``set``."""
        return ("set", "map")[" : " in self.type]

    def definition(self) -> str:
        """``{ type ...; flags ...; timeout ...; }`` without the elements."""
        timeout = duration(self.timeout) if self.timeout is not None else ""
        attrs = (("type", self.type), ("flags", self.flags), ("timeout", timeout))
        return "{ " + " ".join(f"{k} {v};" for k, v in attrs if v) + " }"


@dataclass(frozen=True)
class Chain:
    """A chain: ``hook`` is a base chain's type/hook/priority line (None: a regular one);
    ``comment`` a digest of the rules of a chain whose name does not say them (read
    back instead of the rules; ``rules`` is empty in a chain read back)."""

    name: str
    hook: str | None
    rules: tuple[str, ...]
    comment: str = ""


@dataclass(frozen=True)
class ServiceNft:
    """The whole table: sets and maps (with their elements) and chains."""

    sets: Mapping[str, NftSet] = field(default_factory=dict)
    chains: Mapping[str, Chain] = field(default_factory=dict)


@dataclass(frozen=True)
class PortParts:
    """What one service port adds to the table."""

    chains: tuple[Chain, ...] = ()
    sets: tuple[NftSet, ...] = ()
    elements: tuple[tuple[str, str], ...] = ()  # (set name, element)


def duration(seconds: int) -> str:
    """A timeout as nft prints it: ``3h``, ``1m30s``, ``1d2h``."""
    parts, left = [], seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


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
        self._udp: Counter[tuple[str, int]] = Counter()  # UDP endpoints, per port using them
        self._last: tuple[ServicePort, ...] = ()  # the ports last rendered

    def render(self, table: ServiceTable) -> ServiceNft:
        """The nftables table for ``table`` (empty value: no table at all)."""
        changes, self._last = self._changes(table.ports), ()  # () until all are in
        for key, port in changes:
            if key in self._ports:
                self._take_out(key)
            if port is not None:
                self._put_in(key, port)
        self._last = table.ports
        if not table.ports:
            return ServiceNft()
        sets = dict(self._sets)
        nodes = Counter(str(ip) for ip in table.node_ips)
        for fixed in fixed_sets(self.node, {**self._elements, NODE_IPS: nodes}):
            sets[fixed.name] = fixed
        return ServiceNft(sets, dict(self._chains))

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
        if port.protocol == "udp":
            self._udp.update((str(e.ip), e.port) for e in port.endpoints)

    def _take_out(self, key: str) -> None:
        port = self._ports.pop(key)
        part = self._parts.pop(key)
        for chain in part.chains:
            self._chains.pop(chain.name, None)
        for found in part.sets:
            self._sets.pop(found.name, None)
        for name, element in part.elements:
            counts = self._elements[name]
            counts[element] -= 1
            if counts[element] <= 0:
                del counts[element]
        for udp in [(str(e.ip), e.port) for e in port.endpoints if port.protocol == "udp"]:
            self._udp[udp] -= 1
            if self._udp[udp] <= 0:
                del self._udp[udp]


def fixed_sets(node: NodeNetwork, elements: Mapping[str, Counter[str]]) -> list[NftSet]:
    """The table's own sets and maps, holding the elements the ports gave."""
    cluster = frozenset(str(n) for n in collapse(node.cluster_networks))

    def of(name: str) -> frozenset[str]:
        return frozenset(elements.get(name, ()))  # the counter's keys

    return [
        NftSet(CLUSTER_NETWORKS, "ipv4_addr", "interval", elements=cluster),
        NftSet(HAIRPIN, "ipv4_addr . ipv4_addr", elements=of(HAIRPIN)),
        NftSet(NODE_IPS, "ipv4_addr", elements=of(NODE_IPS)),
        NftSet(SERVICE_IPS, f"{ADDRESS_KEY} : verdict", elements=of(SERVICE_IPS)),
        NftSet(NODE_PORTS, f"{PORT_KEY} : verdict", elements=of(NODE_PORTS)),
        NftSet(NO_ENDPOINT_IPS, f"{ADDRESS_KEY} : verdict", elements=of(NO_ENDPOINT_IPS)),
        NftSet(
            NO_ENDPOINT_NODE_PORTS, f"{PORT_KEY} : verdict", elements=of(NO_ENDPOINT_NODE_PORTS)
        ),
    ]


def fixed_chains(node: NodeNetwork) -> list[tuple[str, Chain]]:
    """Base chains and the shared regular chains."""
    nat = "type nat hook {} priority {}; policy accept;"
    filt = "type filter hook {} priority filter - 1; policy accept;"
    local = f"ip saddr {node.subnet} ip daddr {node.subnet} ct status dnat masquerade"
    hairpin = f"ct status dnat ip saddr . ip daddr @{HAIRPIN}"
    mark_hairpin = f"{hairpin} meta mark set meta mark | {HAIRPIN_MARK}"
    postrouting = [
        f"meta mark & {MASQUERADE_MARK} == {MASQUERADE_MARK} masquerade",
        f"{hairpin} masquerade",
        *([] if node.isolation else [local]),
    ]
    chains = [
        Chain("prerouting", nat.format("prerouting", "dstnat"), (f"jump {SERVICES_CHAIN}",)),
        Chain("output", nat.format("output", "-100"), (f"jump {SERVICES_CHAIN}",)),
        Chain("postrouting", nat.format("postrouting", "srcnat"), tuple(postrouting)),
        Chain("filter_input", filt.format("input"), (NEW_ONLY,)),
        Chain("filter_forward", filt.format("forward"), (mark_hairpin, NEW_ONLY)),
        Chain("filter_output", filt.format("output"), (NEW_ONLY,)),
        Chain(
            SERVICES_CHAIN,
            None,
            (
                f"ip daddr . meta l4proto . th dport vmap @{SERVICE_IPS}",
                f"fib daddr type local meta l4proto . th dport vmap @{NODE_PORTS}",
                f"ip daddr @{NODE_IPS} meta l4proto . th dport vmap @{NODE_PORTS}",
            ),
        ),
        Chain(
            CHECK_CHAIN,
            None,
            (
                f"ip daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_IPS}",
                f"fib daddr type local meta l4proto . th dport vmap @{NO_ENDPOINT_NODE_PORTS}",
            ),
        ),
        Chain(REJECT_CHAIN, None, ("reject with tcp reset", "reject")),
    ]
    return [(c.name, dataclasses.replace(c, comment=digest(c.rules))) for c in chains]


def digest(rules: tuple[str, ...]) -> str:
    """A short digest of a chain's rules (its name's tail, or its comment)."""
    return hashlib.blake2b("\n".join(rules).encode(), digest_size=6).hexdigest()


# --- one service port ------------------------------------------------------------------------


def port_parts(port: ServicePort, node: NodeNetwork) -> PortParts:
    """The chains, sets and map elements of one service port on ``node``."""
    chains: list[Chain] = []
    sets: list[NftSet] = []
    elements: list[tuple[str, str]] = [
        (HAIRPIN, f"{e.ip} . {e.ip}") for e in port.endpoints if e.local
    ]
    svc: str | None = None
    internal = port.internal_endpoints()
    if port.cluster_ip is not None:
        entry = f"{port.cluster_ip} . {port.protocol} . {port.port}"
        if internal:
            rules, more_chains, more_sets = choose(port, internal, "svc")
            mark_outside = f"ip saddr != @{CLUSTER_NETWORKS} {MARK}"
            chain = addressed("svc", port, (mark_outside, *rules))
            svc = chain.name
            chains += [chain, *more_chains]
            sets += more_sets
            elements.append((SERVICE_IPS, f"{entry} : goto {svc}"))
        else:
            elements.append((NO_ENDPOINT_IPS, f"{entry} : goto {REJECT_CHAIN}"))
    entries = [(SERVICE_IPS, f"{ip} . {port.protocol} . {port.port}") for ip in port.external_ips]
    if port.node_port is not None:
        entries.append((NODE_PORTS, f"{port.protocol} . {port.node_port}"))
    if not entries:
        return PortParts(tuple(chains), tuple(sets), tuple(elements))
    if not port.endpoints:
        refused = {SERVICE_IPS: NO_ENDPOINT_IPS, NODE_PORTS: NO_ENDPOINT_NODE_PORTS}
        elements += [(refused[m], f"{e} : goto {REJECT_CHAIN}") for m, e in entries]
        return PortParts(tuple(chains), tuple(sets), tuple(elements))
    rules, more_chains, more_sets = external_rules(port, node, svc)
    ext = addressed("ext", port, tuple(rules))
    chains += [ext, *more_chains]
    sets += more_sets
    elements += [(m, f"{e} : goto {ext.name}") for m, e in entries]
    return PortParts(tuple(chains), tuple(sets), tuple(elements))


def external_rules(
    port: ServicePort, node: NodeNetwork, svc: str | None
) -> tuple[list[str], list[Chain], list[NftSet]]:
    """A node port's or external IP's rules, by where the packet comes from:

    - this node's own pods: under Local the cluster-IP way; under Cluster any endpoint,
      unmasqueraded (the reply comes back through this node anyway);
    - with isolation, other nodes' pods: local endpoints only, unmasqueraded, or dropped.
      Masqueraded, a pod's packet would reach an endpoint on a third node from this
      node's address, which isolation and NetworkPolicy always admit;
    - the rest: under Local local endpoints only with the client's address kept (none:
      dropped, the node does not answer); under Cluster any endpoint, masqueraded."""
    external = port.external_endpoints()
    local = [e for e in port.endpoints if e.local]
    rules: list[str] = []
    chains: list[Chain] = []
    sets: list[NftSet] = []

    def add(prefix: str, endpoints: list[Endpoint] | tuple[Endpoint, ...], group: str) -> None:
        found, more_chains, more_sets = choose(port, endpoints, group)
        rules.extend(f"{prefix}{rule}" for rule in found)
        chains.extend(more_chains)
        sets.extend(more_sets)

    own = f"ip saddr {node.subnet} "
    if port.external_local and svc:
        rules.append(f"{own}goto {svc}")
    elif not port.external_local:
        add(own, port.endpoints, "own")
    if node.isolation and not port.external_local:
        pods = f"ip saddr @{CLUSTER_NETWORKS} "
        if local:
            add(pods, local, "pods")
        else:
            rules.append(f"{pods}drop")
    if port.external_local:
        if external:
            add("", external, "ext")
        else:
            rules.append("drop")
    else:
        rules.append(MARK)
        add("", external, "ext")
    return rules, chains, sets


def addressed(kind: str, port: ServicePort, rules: tuple[str, ...]) -> Chain:
    """A service port's chain, named by its content: ``<kind>/<key>/<digest of rules>``.
    A change makes a new chain and repoints the map element, so reading the table back
    needs chain names only, never their rules."""
    return Chain(f"{kind}/{port.key}/{digest(rules)}", None, rules)


def choose(
    port: ServicePort, endpoints: Iterable[Endpoint], group: str
) -> tuple[list[str], list[Chain], list[NftSet]]:
    """Rules that DNAT to one of ``endpoints`` at random (affinity first, if any).

    The pick is a number in the connection's conntrack mark (``numgen random``), then one
    rule per endpoint; an anonymous map per service (``numgen ... map { }``) would make
    every ``nft`` run read thousands of sets (3.6 s instead of 0.6 s to build 5,000
    services; 0.3 s instead of 0.05 s per change)."""
    chosen = sorted(endpoints)
    proto = port.protocol
    pick = [f"ct mark set numgen random mod {len(chosen)}"] if len(chosen) > 1 else []
    rules: list[str] = []
    chains: list[Chain] = []
    sets: list[NftSet] = []
    for i, e in enumerate(chosen):
        dnat = f"meta l4proto {proto} dnat to {e.ip}:{e.port}"
        when = f"ct mark 0x{i:08x} " if pick else ""
        if port.affinity_seconds is None:
            pick.append(f"{when}{dnat}")
            continue
        name = f"{group}/{port.key}/{e.ip}-{e.port}/{port.affinity_seconds}"
        chain, aff = f"ep/{name}", f"aff/{name}"
        sets.append(NftSet(aff, "ipv4_addr", "dynamic,timeout", port.affinity_seconds, None))
        chains.append(Chain(chain, None, (f"update @{aff} {{ ip saddr }}", dnat)))
        rules.append(f"ip saddr @{aff} goto {chain}")
        pick.append(f"{when}goto {chain}")
    return [*rules, *pick], chains, sets
