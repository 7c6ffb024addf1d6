"""The compiled, backend-neutral rule set: isolation and NetworkPolicy as sets and maps.

``compile_rules`` produces a ``RuleSet`` from the API objects; a data plane backend renders
it (nftables now, OpenFlow later) and ``evaluate`` reads the very same value to explain a
verdict, so ``podnet trace`` and the data plane cannot disagree.

How a backend renders it, with a rule count that does not grow with pods x pods:

- Identity is the packet's source IP. That is trustworthy because the data plane already
  drops spoofed pod traffic (per-pod anti-spoofing), as OpenShift SDN's table 20 does.
- ``plugin`` subnet: nothing to render, everything passes.
- ``plugin`` multitenant, ``RuleSet.isolation``: a map pod IP → VNID over every pod of the
  cluster (all nodes). A non-pod address (the node, its gateway, the outside) is VNID 0.
  The whole policy is a fixed handful of rules: pass when the source VNID is 0, or the
  destination VNID is 0, or both are equal; drop otherwise. Pods whose project has no
  VNID yet (``unassigned``) meet only VNID 0. (nftables: ``podnet.dataplane.linux.policytable``,
  a verdict map from a source pod to the chain of its VNID.)
- ``plugin`` networkpolicy: replies of allowed connections pass (conntrack, a backend
  concern). A pod isolated for egress needs an egress ``PolicyRule`` whose targets hold
  it, whose peers hold the destination and whose ports hold the packet; the same for
  ingress, mirrored. Each rule is one match over sets (a second when it has both pod and
  block peers, or both port ranges and named ports), so the rules grow with policies.
  ``peers`` is pod IPs plus blocks; ``every_address``/``every_packet`` mean no match at
  all on that side. A pod and its own node (``node_addresses``: its IP and gateway)
  always reach each other, as Kubernetes defines. nftables: see
  ``podnet.dataplane.linux.policytable``; in OpenFlow the same rules become conjunctive matches.
- Sets are shared: rules with equal members use one set, named by a digest of its
  members (``distinct_sets``, ``podnet.policy.digests``). ``size`` counts what such a rendering
  holds, so rules grow with policy rules and elements with pods + peers.
- Traffic from a pod to its own IP never leaves the pod's network namespace (loopback), so
  no data plane sees it, and the rule set allows it.
- Fail closed (multitenant and networkpolicy): an address inside the cluster's pod
  networks (``pod_networks``) that no running pod and no node owns (``unowned``: a
  sandbox whose Pod object is gone, an address not yet or no longer recorded) is allowed
  nothing, to or from, whatever the rest says. VNID 0 goes only to what is positively
  global: pods of global projects and the nodes' own addresses.

Named ports are resolved here, once, per destination pod: a rule port ``http`` becomes the
entries (pod IP, protocol, containerPort) of the pods that name a port ``http`` with that
protocol, limited to the pods the rule can reach (its targets for ingress, its peer pods
for egress). The backend checks ``ip daddr . l4proto . dport`` against that set, so the
number of elements grows with pods, never with pods x pods.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from podnet.model.network import SUBNET
from podnet.policy.digests import SetDigests

GLOBAL_VNID = 0
INGRESS, EGRESS = "ingress", "egress"
PROTOCOLS = ("TCP", "UDP", "SCTP")
LOWEST_PORT, HIGHEST_PORT = 0, 65535


def _ip_order(ips: Iterable[IPv4Address]) -> list[str]:
    return [str(ip) for ip in sorted(ips)]


@dataclass(frozen=True)
class Endpoint:
    """A running pod as the data plane sees it. ``vnid`` is None while its project has none."""

    ip: IPv4Address
    namespace: str
    name: str
    node: str
    vnid: int | None

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def canonical(self) -> list[Any]:
        """The endpoint as plain JSON values."""
        return [str(self.ip), self.namespace, self.name, self.node, self.vnid]


@dataclass(frozen=True, order=True)
class PortRange:
    """``protocol`` ports ``first``..``last`` inclusive (0..65535: every port)."""

    protocol: str
    first: int
    last: int

    def covers(self, protocol: str, port: int | None) -> bool:
        """Whether the range matches; a packet of unknown port only matches every port."""
        if protocol != self.protocol:
            return False
        if port is None:
            return self.is_every_port()
        return self.first <= port <= self.last

    def is_every_port(self) -> bool:
        """True when the range is the protocol's whole port space."""
        return self.first == LOWEST_PORT and self.last == HIGHEST_PORT

    def __str__(self) -> str:
        if self.is_every_port():
            return f"{self.protocol.lower()}/*"
        span = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{self.protocol.lower()}/{span}"


@dataclass(frozen=True, order=True)
class NamedPort:
    """A named port resolved on one destination pod: (pod IP, protocol, containerPort)."""

    ip: IPv4Address
    protocol: str
    port: int
    name: str


@dataclass(frozen=True)
class PortMatch:
    """What a rule allows at layer 4. ``every_packet``: no ``ports``, so any protocol."""

    every_packet: bool
    ranges: tuple[PortRange, ...] = ()
    named: frozenset[NamedPort] = frozenset()

    def matches(self, dst: IPv4Address, protocol: str, port: int | None) -> bool:
        """Whether a packet to ``dst`` with this protocol and port is allowed."""
        if self.every_packet:
            return True
        if any(r.covers(protocol, port) for r in self.ranges):
            return True
        return (dst, protocol, port) in self.named_keys

    @cached_property
    def named_keys(self) -> frozenset[tuple[IPv4Address, str, int]]:
        """The named entries as the backend's set holds them: (IP, protocol, port)."""
        return frozenset((n.ip, n.protocol, n.port) for n in self.named)

    def canonical(self, digest: SetDigests) -> dict[str, Any]:
        """The port match as plain JSON values."""
        ranges = [[r.protocol, r.first, r.last] for r in self.ranges]
        return {"every": self.every_packet, "ranges": ranges, "named": digest(self.named)}


@dataclass(frozen=True)
class PeerSet:
    """The other end of a rule: anything (``every_address``), or pod IPs plus blocks.

    ``blocks`` are ipBlock CIDRs with their excepts subtracted, merged into a sorted list
    of non-overlapping networks (an nftables interval set; OpenFlow: one match each).
    """

    every_address: bool
    pods: frozenset[IPv4Address] = frozenset()
    blocks: tuple[IPv4Network, ...] = ()

    def contains(self, ip: IPv4Address) -> bool:
        """Whether ``ip`` is a peer."""
        if self.every_address or ip in self.pods:
            return True
        return any(ip in block for block in self.blocks)

    def canonical(self, digest: SetDigests) -> dict[str, Any]:
        """The peer set as plain JSON values."""
        blocks = [str(b) for b in self.blocks]
        return {"every": self.every_address, "pods": digest(self.pods), "blocks": blocks}


@dataclass(frozen=True)
class PolicyRule:
    """One ingress or egress rule of one policy, id ``<ns>/<policy>/<direction>/<i>``."""

    id: str
    direction: str  # INGRESS or EGRESS
    targets: frozenset[IPv4Address]  # the policy's selected pods
    peers: PeerSet
    ports: PortMatch

    def canonical(self, digest: SetDigests) -> dict[str, Any]:
        """The rule as plain JSON values."""
        return {
            "id": self.id,
            "targets": digest(self.targets),
            "peers": self.peers.canonical(digest),
            "ports": self.ports.canonical(digest),
        }


@dataclass(frozen=True)
class CompiledPolicy:
    """One NetworkPolicy: which pods it isolates, for which directions, and its rules."""

    namespace: str
    name: str
    ingress: bool  # policyTypes has Ingress
    egress: bool  # policyTypes has Egress
    targets: frozenset[IPv4Address]
    rules: tuple[PolicyRule, ...]

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def isolates(self, ip: IPv4Address, direction: str) -> bool:
        """Whether this policy selects ``ip`` for ``direction``."""
        applies = self.ingress if direction == INGRESS else self.egress
        return applies and ip in self.targets

    def canonical(self, digest: SetDigests) -> dict[str, Any]:
        """The policy as plain JSON values."""
        return {
            "key": self.key,
            "types": [self.ingress, self.egress],
            "targets": digest(self.targets),
            "rules": [r.canonical(digest) for r in self.rules],
        }


@dataclass(frozen=True)
class VnidIsolation:
    """Multitenant: the map pod IP → VNID (sorted by IP) and the global rule."""

    vnids: tuple[tuple[IPv4Address, int], ...]
    unassigned: frozenset[IPv4Address] = frozenset()
    global_vnid: int = GLOBAL_VNID

    def allows(self, src_vnid: int | None, dst_vnid: int | None) -> bool:
        """The isolation rule: either side global, or both the same (known) VNID."""
        if self.global_vnid in (src_vnid, dst_vnid):
            return True
        return src_vnid is not None and src_vnid == dst_vnid

    @cached_property
    def by_ip(self) -> Mapping[IPv4Address, int]:
        """The VNID map as a lookup."""
        return dict(self.vnids)

    def canonical(self) -> dict[str, Any]:
        """The isolation as plain JSON values."""
        return {
            "vnids": [[str(ip), vnid] for ip, vnid in self.vnids],
            "unassigned": _ip_order(self.unassigned),
            "global": self.global_vnid,
        }


@dataclass(frozen=True)
class RuleSetSize:
    """What a set-based backend holds: rules, and elements across all its sets and maps."""

    rules: int
    set_elements: int


@dataclass(frozen=True)
class RuleSet:
    """Everything the data plane enforces for isolation and policy, for the whole cluster."""

    plugin: str
    endpoints: tuple[Endpoint, ...]  # running pods with an IP, sorted by IP
    host_ips: frozenset[IPv4Address]  # node and hostNetwork addresses: VNID 0, "host"
    isolation: VnidIsolation | None = None  # multitenant only
    policies: tuple[CompiledPolicy, ...] = ()  # networkpolicy only, sorted by key
    ingress_isolated: frozenset[IPv4Address] = frozenset()
    egress_isolated: frozenset[IPv4Address] = frozenset()
    node_addresses: tuple[tuple[str, IPv4Address], ...] = ()  # (node, its IP or gateway)
    pod_networks: tuple[IPv4Network, ...] = ()  # the cluster networks: owned, or denied

    @property
    def fails_closed(self) -> bool:
        """Whether unowned pod-network addresses are denied (isolating modes that know
        their pod networks)."""
        return self.plugin != SUBNET and bool(self.pod_networks)

    @cached_property
    def owned(self) -> frozenset[IPv4Address]:
        """The addresses in the pod networks that have a live owner: a running pod, a
        node (its gateway) or a hostNetwork pod. Empty unless ``fails_closed``."""
        if not self.fails_closed:
            return frozenset()
        known = {e.ip for e in self.endpoints} | self.host_ips
        return frozenset(ip for ip in known if self.in_pod_networks(ip))

    def in_pod_networks(self, ip: IPv4Address) -> bool:
        """Whether ``ip`` lies in one of the cluster's pod networks."""
        return any(ip in network for network in self.pod_networks)

    def unowned(self, ip: IPv4Address) -> bool:
        """Whether ``ip`` is a pod-network address with no live owner (fail closed)."""
        return self.fails_closed and self.in_pod_networks(ip) and ip not in self.owned

    def resident(self, node: str) -> frozenset[IPv4Address]:
        """The addresses of node ``node`` (its IP, its gateway): a pod's own node."""
        return self._residents.get(node, frozenset())

    @cached_property
    def _residents(self) -> Mapping[str, frozenset[IPv4Address]]:
        found: dict[str, set[IPv4Address]] = {}
        for node, ip in self.node_addresses:
            found.setdefault(node, set()).add(ip)
        return {node: frozenset(ips) for node, ips in found.items()}

    @cached_property
    def rules(self) -> tuple[PolicyRule, ...]:
        """Every policy rule, in policy order then rule order."""
        return tuple(rule for policy in self.policies for rule in policy.rules)

    def policies_selecting(self, ip: IPv4Address) -> list[CompiledPolicy]:
        """The policies whose targets hold ``ip``, in key order.

        Policies share a targets set per repeated selector, so this tests each distinct
        set once rather than every policy.
        """
        holding = {targets for targets in self._distinct_targets if ip in targets}
        return [p for p in self.policies if p.targets in holding]

    @cached_property
    def _distinct_targets(self) -> frozenset[frozenset[IPv4Address]]:
        return frozenset(policy.targets for policy in self.policies)

    @cached_property
    def by_ip(self) -> Mapping[IPv4Address, Endpoint]:
        """The endpoints looked up by IP."""
        return {e.ip: e for e in self.endpoints}

    def canonical(self) -> dict[str, Any]:
        """The whole rule set as plain JSON values, in a fixed order; sets by digest."""
        digest = SetDigests()
        return {
            "plugin": self.plugin,
            "endpoints": [e.canonical() for e in self.endpoints],
            "hosts": _ip_order(self.host_ips),
            "isolation": self.isolation.canonical() if self.isolation else None,
            "policies": [p.canonical(digest) for p in self.policies],
            "ingress_isolated": _ip_order(self.ingress_isolated),
            "egress_isolated": _ip_order(self.egress_isolated),
            "nodes": [[node, str(ip)] for node, ip in self.node_addresses],
            "pod_networks": [str(n) for n in self.pod_networks],
        }

    def fingerprint(self) -> str:
        """A SHA-256 of the canonical form: equal for equivalent inputs, in any order."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def size(self) -> RuleSetSize:
        """Rules and set elements a set-based rendering needs (see the module docstring)."""
        rules = 4 if self.isolation is not None else 0
        rules += 2 if self.policies else 0
        rules += 2 if self.fails_closed else 0
        rules += sum(_rendered_rules(rule) for rule in self.rules)
        return RuleSetSize(rules, sum(len(members) for members in self.distinct_sets()))

    def distinct_sets(self) -> list[frozenset[Any]]:
        """Every set and map a backend holds, once: rules with equal members share a set.

        Compile hands out one frozenset object per distinct selector result, so a backend
        names a set by its members (a hash of them) and renders it once.
        """
        found: dict[frozenset[Any], None] = {}
        for members in self._sets():
            if members:
                found.setdefault(members, None)
        return list(found)

    def _sets(self) -> Iterator[frozenset[Any]]:
        if self.isolation is not None:
            yield frozenset(self.isolation.vnids)
            yield self.isolation.unassigned
        yield self.ingress_isolated
        yield self.egress_isolated
        for rule in self.rules:
            yield rule.targets
            yield rule.peers.pods
            yield frozenset(rule.peers.blocks)
            yield frozenset(rule.ports.ranges)
            yield rule.ports.named_keys


def _rendered_rules(rule: PolicyRule) -> int:
    """One accept rule for the port ranges (or every packet), one more for named ports."""
    ports = rule.ports
    plain = ports.every_packet or bool(ports.ranges)
    return int(plain) + int(bool(ports.named))
