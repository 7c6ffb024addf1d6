"""An EgressNetworkPolicy compiled to what a data plane needs: the destinations a project's
pods may not reach, as disjoint address intervals.

OpenShift SDN's semantics: rules in order, ``Allow`` or ``Deny``, to a ``cidrSelector`` or
a ``dnsName``; the first rule that matches a destination decides; no match allows. It
applies only to destinations outside the cluster and service networks (the data plane
passes those before it looks here).

First-match over CIDRs compiles to one interval set: every address goes to the first
rule that covers it (a sweep over the rules' interval ends), and the parts of Deny rules
are kept.
Allow parts only shadow later Deny rules, so they need no element of their own: a
packet's cost is one interval-set lookup whatever the number of rules. A ``dnsName``
rule stands for the addresses its name resolves to right now (``resolved``); a rule
whose name has no addresses yet matches nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from podnet.policy.ranges import Interval, merge

ALLOW, DENY = "Allow", "Deny"


class FirewallError(ValueError):
    """A policy that cannot be compiled (validation lets none through)."""


@dataclass(frozen=True)
class Rule:
    """One egress rule: ``cidr`` or ``dns_name``, exactly one."""

    action: str
    cidr: IPv4Network | None = None
    dns_name: str | None = None


@dataclass(frozen=True)
class Region:
    """Addresses ``first``..``last`` (inclusive) decided by rule ``rule`` (0-based)."""

    first: int
    last: int
    action: str
    rule: int


def rules_of(policy: Mapping[str, object]) -> list[Rule]:
    """The rules of an EgressNetworkPolicy object, in order."""
    spec = policy.get("spec")
    egress = spec.get("egress") if isinstance(spec, Mapping) else None
    rules: list[Rule] = []
    for index, item in enumerate(egress if isinstance(egress, list) else []):
        to = item.get("to") if isinstance(item, Mapping) else None
        action = item.get("type") if isinstance(item, Mapping) else None
        if action not in (ALLOW, DENY) or not isinstance(to, Mapping):
            raise FirewallError(f"spec.egress[{index}] is not a valid rule")
        cidr, name = to.get("cidrSelector"), to.get("dnsName")
        if (cidr is None) == (name is None):
            raise FirewallError(f"spec.egress[{index}].to needs one of cidrSelector, dnsName")
        rules.append(
            Rule(
                str(action),
                None if cidr is None else IPv4Network(str(cidr), strict=False),
                None if name is None else str(name).lower().rstrip("."),
            )
        )
    return rules


def _intervals(rule: Rule, resolved: Mapping[str, Iterable[IPv4Address]]) -> list[Interval]:
    if rule.cidr is not None:
        return [(int(rule.cidr.network_address), int(rule.cidr.broadcast_address))]
    addresses = resolved.get(rule.dns_name or "", ())
    return merge((int(a), int(a)) for a in addresses)


def regions(
    rules: Sequence[Rule], resolved: Mapping[str, Iterable[IPv4Address]] | None = None
) -> list[Region]:
    """Every address some rule decides, as disjoint regions in address order, each with
    the first rule that matches it: a sweep over the rules' interval ends, the lowest
    rule index among those covering each piece winning (O(n log n) in the intervals)."""
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}  # first address after the interval -> rule indexes
    for index, rule in enumerate(rules):
        for first, last in _intervals(rule, resolved or {}):
            starts.setdefault(first, []).append(index)
            ends.setdefault(last + 1, []).append(index)
    active: list[int] = []  # a heap of rule indexes; ended ones removed lazily
    covering: dict[int, int] = {}  # rule index -> how many of its intervals are open
    found: list[Region] = []
    points = sorted(set(starts) | set(ends))
    for here, there in zip(points, [*points[1:], None], strict=True):
        for index in ends.get(here, ()):
            covering[index] -= 1
        for index in starts.get(here, ()):
            covering[index] = covering.get(index, 0) + 1
            heapq.heappush(active, index)
        while active and covering.get(active[0], 0) == 0:
            heapq.heappop(active)
        if not active or there is None:
            continue
        winner = active[0]
        last = there - 1
        if found and found[-1].rule == winner and found[-1].last + 1 == here:
            found[-1] = Region(found[-1].first, last, found[-1].action, winner)
        else:
            found.append(Region(here, last, rules[winner].action, winner))
    return found


def denied(
    rules: Sequence[Rule], resolved: Mapping[str, Iterable[IPv4Address]] | None = None
) -> list[Interval]:
    """The destinations the policy denies: merged intervals, the interval set's elements."""
    return merge((r.first, r.last) for r in regions(rules, resolved) if r.action == DENY)


def verdict(
    rules: Sequence[Rule],
    address: IPv4Address,
    resolved: Mapping[str, Iterable[IPv4Address]] | None = None,
) -> tuple[str, int | None]:
    """(Allow or Deny, the deciding rule's index, None when no rule matches) for one
    destination: what ``podnet trace`` says, and the oracle the compiled set is tested
    against."""
    value = int(address)
    for index, rule in enumerate(rules):
        if any(first <= value <= last for first, last in _intervals(rule, resolved or {})):
            return rule.action, index
    return ALLOW, None
