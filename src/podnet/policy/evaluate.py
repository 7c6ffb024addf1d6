"""The verdict for one packet, read from the compiled ``RuleSet`` the data plane renders.

This is the single source of truth for ``podnet trace`` and the oracle the data plane is
tested against, so it reads only the compiled sets (never the policies), exactly as a
backend's rules would:

- subnet: everything passes;
- multitenant: the VNID map and the global rule (non-pod addresses are VNID 0);
- networkpolicy: an egress check on the source pod and an ingress check on the destination
  pod; a side that is not a pod (host, outside) has nothing to check. An isolated pod
  needs some rule whose targets hold it, whose peers hold the other end and whose ports
  hold the packet.
- A pod's traffic to its own IP stays on its loopback, out of every data plane's sight,
  and passes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from podnet.model.network import MULTITENANT, SUBNET
from podnet.policy.model import (
    EGRESS,
    GLOBAL_VNID,
    INGRESS,
    PROTOCOLS,
    Endpoint,
    PolicyRule,
    RuleSet,
)


@dataclass(frozen=True)
class Verdict:
    """Whether a packet passes, and why, in terms of the compiled rules."""

    allowed: bool
    reasons: list[str]
    mode: str  # the plugin name
    src_vnid: int | None  # None: a pod whose project has no VNID yet
    dst_vnid: int | None
    allowed_by: list[str] = field(default_factory=list)  # ids of the rules that allow it
    denied_because: str = ""
    src: str = ""  # "pod x/a (10.128.0.5 on node-1)", "host 10.0.0.1", "external 8.8.8.8"
    dst: str = ""
    protocol: str = "TCP"
    port: int | None = None


@dataclass(frozen=True)
class Packet:
    """The first packet of a connection, as the data plane classifies it."""

    src: IPv4Address
    dst: IPv4Address
    protocol: str  # TCP, UDP, SCTP, or another IP protocol name such as ICMP
    port: int | None  # destination port; None when the protocol has none (or unknown)

    def service(self) -> str:
        """``tcp/80``, or ``tcp (any port)``, ``icmp``."""
        return self.service_text(self.protocol, self.port)

    @staticmethod
    def service_text(protocol: str, port: int | None) -> str:
        """``tcp/80``, or ``tcp (any port)``, ``icmp``."""
        if port is not None:
            return f"{protocol.lower()}/{port}"
        portless = protocol not in PROTOCOLS
        return protocol.lower() if portless else f"{protocol.lower()} (any port)"


@dataclass
class _Side:
    """The result of one side's check (egress on the source, ingress on the destination)."""

    allowed: bool
    reasons: list[str]
    allowed_by: list[str] = field(default_factory=list)
    denied_because: str = ""


def evaluate(
    ruleset: RuleSet,
    src: str | IPv4Address,
    dst: str | IPv4Address,
    protocol: str = "TCP",
    port: int | None = None,
) -> Verdict:
    """Whether ``src`` may open a ``protocol``/``port`` connection to ``dst``, and why."""
    packet = Packet(_address(src), _address(dst), protocol.upper(), port)
    if packet.src == packet.dst:
        side = _Side(True, ["loopback: traffic to its own address never leaves the pod"])
    elif ruleset.unowned(packet.src) or ruleset.unowned(packet.dst):
        side = _unowned(ruleset, packet)
    elif ruleset.plugin == SUBNET:
        side = _Side(True, ["subnet mode: one flat network, every pod reaches every pod"])
    elif ruleset.plugin == MULTITENANT:
        side = _multitenant(ruleset, packet)
    else:
        side = _network_policy(ruleset, packet)
    return _verdict(ruleset, packet, side)


def _address(value: str | IPv4Address) -> IPv4Address:
    return value if isinstance(value, IPv4Address) else IPv4Address(value)


def _verdict(ruleset: RuleSet, packet: Packet, side: _Side) -> Verdict:
    return Verdict(
        allowed=side.allowed,
        reasons=side.reasons,
        mode=ruleset.plugin,
        src_vnid=vnid_of(ruleset, packet.src),
        dst_vnid=vnid_of(ruleset, packet.dst),
        allowed_by=side.allowed_by,
        denied_because=side.denied_because,
        src=describe_address(ruleset, packet.src),
        dst=describe_address(ruleset, packet.dst),
        protocol=packet.protocol,
        port=packet.port,
    )


def vnid_of(ruleset: RuleSet, ip: IPv4Address) -> int | None:
    """The VNID the data plane gives ``ip``: the map's, else 0 (host, gateway, outside)."""
    if ruleset.isolation is not None:
        if ip in ruleset.isolation.unassigned:
            return None
        return ruleset.isolation.by_ip.get(ip, GLOBAL_VNID)
    endpoint = ruleset.by_ip.get(ip)
    return endpoint.vnid if endpoint is not None else GLOBAL_VNID


def describe_address(ruleset: RuleSet, ip: IPv4Address) -> str:
    """What ``ip`` is: a pod (with its node), the host, an unowned pod-network address,
    or an outside address."""
    endpoint = ruleset.by_ip.get(ip)
    if endpoint is not None:
        return f"pod {endpoint.key} ({ip} on {endpoint.node or 'no node'})"
    if ip in ruleset.host_ips:
        return f"host {ip}"
    return f"unowned {ip}" if ruleset.unowned(ip) else f"external {ip}"


def _unowned(ruleset: RuleSet, packet: Packet) -> _Side:
    """Fail closed: a pod-network address that no running pod or node owns."""
    ends = [ip for ip in (packet.src, packet.dst) if ruleset.unowned(ip)]
    why = (
        f"{' and '.join(map(str, ends))} is in the pod network but no running pod or node "
        "owns it: an address without a live owner is allowed nothing (fail closed)"
    )
    return _Side(False, [why], denied_because=why)


# --- multitenant --------------------------------------------------------------------------


def _multitenant(ruleset: RuleSet, packet: Packet) -> _Side:
    assert ruleset.isolation is not None
    src, dst = vnid_of(ruleset, packet.src), vnid_of(ruleset, packet.dst)
    if ruleset.isolation.allows(src, dst):
        return _Side(True, [_vnid_pass_reason(src, dst)])
    why = _vnid_denial(src, dst)
    return _Side(False, [why], denied_because=why)


def _vnid_pass_reason(src: int | None, dst: int | None) -> str:
    if src == GLOBAL_VNID:
        return f"the source VNID is {GLOBAL_VNID} (global): it reaches every project"
    if dst == GLOBAL_VNID:
        return f"the destination VNID is {GLOBAL_VNID} (global): every project reaches it"
    return f"source and destination share VNID {src}"


def _vnid_denial(src: int | None, dst: int | None) -> str:
    if src is None or dst is None:
        return "a pod's project has no VNID yet: it meets only VNID 0"
    return f"VNID {src} may not reach VNID {dst}: they differ and neither is global (0)"


# --- networkpolicy ------------------------------------------------------------------------


def _network_policy(ruleset: RuleSet, packet: Packet) -> _Side:
    egress = _check(ruleset, packet, EGRESS)
    ingress = _check(ruleset, packet, INGRESS)
    denials = [s.denied_because for s in (egress, ingress) if not s.allowed]
    return _Side(
        egress.allowed and ingress.allowed,
        egress.reasons + ingress.reasons,
        egress.allowed_by + ingress.allowed_by,
        "; ".join(denials),
    )


def _check(ruleset: RuleSet, packet: Packet, direction: str) -> _Side:
    """Egress on the source pod, or ingress on the destination pod."""
    subject, peer = (packet.src, packet.dst) if direction == EGRESS else (packet.dst, packet.src)
    endpoint = ruleset.by_ip.get(subject)
    if endpoint is None:
        return _Side(True, [f"{direction}: {subject} is not a pod: no policy applies"])
    if peer in ruleset.resident(endpoint.node):
        why = f"{direction}: {peer} is {endpoint.key}'s own node, which policy never blocks"
        return _Side(True, [why])
    isolated = ruleset.ingress_isolated if direction == INGRESS else ruleset.egress_isolated
    if subject not in isolated:
        why = f"{direction}: {endpoint.key} is selected by no {direction} policy: all allowed"
        return _Side(True, [why])
    selecting = ruleset.policies_selecting(subject)
    rules = [
        rule
        for policy in selecting
        for rule in policy.rules
        if rule.direction == direction and subject in rule.targets
    ]
    allowing = [r.id for r in rules if _rule_allows(r, peer, packet)]
    if allowing:
        return _Side(True, [f"{direction}: allowed by {rule}" for rule in allowing], allowing)
    policies = [p.key for p in selecting if p.isolates(subject, direction)]
    return _denied(ruleset, packet, direction, policies, rules)


def _rule_allows(rule: PolicyRule, peer: IPv4Address, packet: Packet) -> bool:
    return rule.peers.contains(peer) and rule.ports.matches(
        packet.dst, packet.protocol, packet.port
    )


def _denied(
    ruleset: RuleSet, packet: Packet, direction: str, policies: list[str], rules: list[PolicyRule]
) -> _Side:
    subject, peer = (packet.src, packet.dst) if direction == EGRESS else (packet.dst, packet.src)
    other = describe_address(ruleset, peer)
    why = (
        f"{direction}: {ruleset.by_ip[subject].key} is isolated by {', '.join(policies)} and no "
        f"{direction} rule of theirs allows {other} {packet.service()}"
    )
    return _Side(False, [why, *(_miss(rule, peer, packet) for rule in rules)], [], why)


def _miss(rule: PolicyRule, peer: IPv4Address, packet: Packet) -> str:
    """Why one candidate rule does not match."""
    if not rule.peers.contains(peer):
        return f"  {rule.id}: {peer} is not among its peers"
    return f"  {rule.id}: {packet.service()} is not among its ports"


# --- many pairs ---------------------------------------------------------------------------


def reachability(
    ruleset: RuleSet,
    protocol: str = "TCP",
    port: int | None = None,
    endpoints: Iterable[Endpoint] | None = None,
) -> dict[tuple[str, str], bool]:
    """(source key, destination key) → allowed, for every ordered pair of pods."""
    chosen = list(ruleset.endpoints if endpoints is None else endpoints)
    return {
        (a.key, b.key): evaluate(ruleset, a.ip, b.ip, protocol, port).allowed
        for a in chosen
        for b in chosen
    }
