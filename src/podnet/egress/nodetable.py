"""One node's egress firewall, backend-neutral: which local pods belong to which firewall,
and what each firewall denies. Both data planes render it (nftables interval sets on
linux, the egress table on ovs).

A firewall belongs to a VNID, as in OpenShift SDN: projects joined into one network share
it. Its limits, and what podnet does where OpenShift SDN is silent:

- global projects (VNID 0) reach everything and are reached by everything: a policy in
  one is not applied (``problems`` says why; the API reports it on the policy);
- one policy per network: two policies for one VNID (two in a project, or one in each of
  two joined projects) fail closed, every destination outside the cluster denied, and
  ``problems`` says why (OpenShift SDN drops everything and says nothing);
- a policy that does not compile fails closed the same way.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Any

from podnet.egress.firewall import FirewallError, denied, rules_of
from podnet.policy.ranges import Interval

Obj = Mapping[str, Any]
EVERYTHING: tuple[Interval, ...] = ((0, 2**32 - 1),)
GLOBAL_VNID = 0


@dataclass(frozen=True)
class NodeFirewall:
    """What a data plane enforces on one node."""

    denied: Mapping[int, tuple[Interval, ...]] = field(default_factory=dict)  # VNID ->
    pods: Mapping[IPv4Address, int] = field(default_factory=dict)  # local pod IP -> VNID
    problems: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (ns, name) ->


def _denied(
    policy: Obj, resolved: Mapping[str, Iterable[IPv4Address]] | None
) -> tuple[Interval, ...]:
    """A policy's denied intervals. One of CIDR rules alone is compiled once per version
    (``metadata.resourceVersion``, else its spec): a change of one policy recompiles that
    one (1,000 rules take ~25 ms), not every policy of the node."""
    spec = policy.get("spec") or {}
    meta = policy.get("metadata") or {}
    version = meta.get("resourceVersion")
    key = (*_key(policy), str(version)) if version else json.dumps(spec, sort_keys=True)
    found = _COMPILED.get(key)  # only policies without names are ever kept
    if found is not None:
        _COMPILED.move_to_end(key)
        return found
    rules = spec.get("egress") if isinstance(spec, Mapping) else None
    named = any(isinstance(r, Mapping) and "dnsName" in (r.get("to") or {}) for r in rules or [])
    found = tuple(denied(rules_of(policy), resolved if named else None))
    if not named:
        _COMPILED[key] = found
        while len(_COMPILED) > COMPILED_MAX:
            _COMPILED.popitem(last=False)
    return found


COMPILED_MAX = 4096  # policies kept compiled, least recently used out first
_COMPILED: collections.OrderedDict[object, tuple[Interval, ...]] = collections.OrderedDict()


def _key(policy: Obj) -> tuple[str, str]:
    meta = policy.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def node_firewall(
    policies: Iterable[Obj],
    vnids: Mapping[str, int],
    pods: Sequence[tuple[str, IPv4Address]],
    resolved: Mapping[str, Iterable[IPv4Address]] | None = None,
) -> NodeFirewall:
    """The firewall of a node whose pods are ``pods`` (namespace, IP), from every
    EgressNetworkPolicy and the namespaces' VNIDs; ``resolved`` gives the addresses each
    DNS name has now."""
    by_vnid: dict[int, list[Obj]] = {}
    problems: dict[tuple[str, str], str] = {}
    for policy in sorted(policies, key=_key):
        namespace = _key(policy)[0]
        vnid = vnids.get(namespace)
        if vnid is None:
            problems[_key(policy)] = f"namespace {namespace!r} has no NetNamespace yet"
        elif vnid == GLOBAL_VNID:
            problems[_key(policy)] = (
                f"namespace {namespace!r} is global (VNID 0): its traffic is not firewalled"
            )
        else:
            by_vnid.setdefault(vnid, []).append(policy)
    local = {vnid for ns, _ in pods if (vnid := vnids.get(ns)) in by_vnid}
    table: dict[int, tuple[Interval, ...]] = {}
    for vnid, found in by_vnid.items():
        if len(found) > 1:
            names = ", ".join("/".join(_key(p)) for p in found)
            for policy in found:
                problems[_key(policy)] = (
                    f"one EgressNetworkPolicy per network, found {names}: every destination "
                    "outside the cluster is denied until one is left"
                )
            table[vnid] = EVERYTHING
            continue
        try:
            table[vnid] = _denied(found[0], resolved)
        except (FirewallError, ValueError) as exc:
            problems[_key(found[0])] = f"{exc}: every destination outside the cluster is denied"
            table[vnid] = EVERYTHING
    return NodeFirewall(
        {vnid: table[vnid] for vnid in sorted(local)},
        {ip: vnids[ns] for ns, ip in pods if vnids.get(ns) in local},
        problems,
    )
