"""Compile isolation and NetworkPolicy, once, into the backend-neutral ``RuleSet``.

Pure: API objects (plain dicts) in, a ``RuleSet`` out. The whole cluster compiles from
scratch on every change, which is cheap (pods are indexed by namespace and label, see
``selection``), and it means an incremental update cannot leave a stale rule behind:
the result equals a fresh build by construction, and ``RuleSet.fingerprint`` proves it.
The node agent uses ``incremental.PolicyCompiler``, which keeps the index and the compiled
policies between changes and is tested to give the same fingerprint as this function.

Kubernetes semantics applied here (networking.k8s.io/v1):

- A policy selects pods of its own namespace with ``podSelector``; it isolates them for
  each of its ``policyTypes`` (default: Ingress, plus Egress when it has egress rules).
- A rule without peers (``from``/``to`` absent or empty) matches every address; without
  ports, every packet. Peers are a union; ports are a union.
- A peer's ``podSelector`` without ``namespaceSelector`` means the policy's namespace; a
  ``namespaceSelector`` without ``podSelector`` means every pod there; both: the pods
  matching the first in namespaces matching the second. ``ipBlock`` is CIDR minus except.
- Every namespace carries ``kubernetes.io/metadata.name=<name>``, as kube-apiserver
  guarantees, so selectors written against it work.
- Pods without an IP, not Running, or not IPv4 are left out; hostNetwork pods are the
  node (their address goes to ``host_ips``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from podnet.model.network import MULTITENANT, NETWORKPOLICY, PLUGINS, SUBNET
from podnet.model.selectors import label_selector_from_spec
from podnet.policy.model import (
    EGRESS,
    GLOBAL_VNID,
    HIGHEST_PORT,
    INGRESS,
    LOWEST_PORT,
    CompiledPolicy,
    Endpoint,
    NamedPort,
    PeerSet,
    PolicyRule,
    PortMatch,
    PortRange,
    RuleSet,
    VnidIsolation,
)
from podnet.policy.ranges import Interval, ip_block_intervals, normalize_ports, to_networks
from podnet.policy.selection import EMPTY, ClusterIndex, PodRecord, PodSet

Obj = Mapping[str, Any]
NAME_LABEL = "kubernetes.io/metadata.name"


def compile_rules(
    plugin: str,
    pods: Iterable[Obj],
    namespaces: Iterable[Obj],
    netnamespaces: Iterable[Obj],
    policies: Iterable[Obj],
    *,
    node_ips: Iterable[str] = (),
    node_addresses: Iterable[tuple[str, str]] = (),
    pod_networks: Iterable[str | IPv4Network] = (),
) -> RuleSet:
    """The rule set for ``plugin`` over the whole cluster (``node_ips``: known host IPs;
    ``node_addresses``: (node, address) pairs, each node's IP and gateway, which are host
    IPs too and always reach that node's own pods; ``pod_networks``: the ClusterNetwork's
    CIDRs, where an address without a live owner is denied)."""
    ruleset = _compile(plugin, pods, namespaces, netnamespaces, policies, node_ips)
    return with_pod_networks(with_node_addresses(ruleset, node_addresses), pod_networks)


def with_pod_networks(ruleset: RuleSet, networks: Iterable[str | IPv4Network]) -> RuleSet:
    """``ruleset`` knowing the cluster's pod networks (sorted), so that it fails closed
    (subnet mode isolates nothing: its rule set stays the empty one)."""
    parsed = tuple(sorted({IPv4Network(n) for n in networks}))
    return replace(ruleset, pod_networks=parsed) if parsed and ruleset.plugin != SUBNET else ruleset


def cluster_pod_networks(cluster_network: Obj) -> list[str]:
    """The CIDRs of a ClusterNetwork object (``clusterNetworks``, or the legacy
    ``network``); unreadable entries are left out."""
    found = [str(e.get("CIDR") or "") for e in cluster_network.get("clusterNetworks") or []]
    found.append(str(cluster_network.get("network") or ""))
    valid = []
    for text in found:
        with contextlib.suppress(ValueError):
            valid.append(str(IPv4Network(text)))
    return sorted(set(valid))


def with_node_addresses(ruleset: RuleSet, pairs: Iterable[tuple[str, str]]) -> RuleSet:
    """``ruleset`` knowing each node's addresses (sorted; added to the host IPs)."""
    parsed = tuple(sorted({(node, IPv4Address(ip)) for node, ip in pairs}))
    if not parsed:
        return ruleset
    hosts = ruleset.host_ips | {ip for _, ip in parsed}
    return replace(ruleset, host_ips=hosts, node_addresses=parsed)


def hostsubnet_addresses(hostsubnet: Obj) -> list[tuple[str, str]]:
    """(node, address) for a HostSubnet: its ``hostIP`` and its subnet's gateway (.1)."""
    node = str((hostsubnet.get("metadata") or {}).get("name") or hostsubnet.get("host") or "")
    found = []
    with contextlib.suppress(ValueError):
        found.append((node, str(IPv4Address(str(hostsubnet.get("hostIP") or "")))))
    with contextlib.suppress(ValueError):
        gateway = IPv4Network(str(hostsubnet.get("subnet"))).network_address + 1
        found.append((node, str(gateway)))
    return found if node else []


def _compile(
    plugin: str,
    pods: Iterable[Obj],
    namespaces: Iterable[Obj],
    netnamespaces: Iterable[Obj],
    policies: Iterable[Obj],
    node_ips: Iterable[str],
) -> RuleSet:
    if plugin not in PLUGINS:
        raise ValueError(f"unknown network plugin {plugin!r}")
    records, hosts = pods_and_hosts(plugin, pods, netnamespaces, node_ips)
    endpoints = tuple(r.endpoint for r in records)
    if plugin == SUBNET:
        return RuleSet(plugin, endpoints, hosts)
    if plugin == MULTITENANT:
        return RuleSet(plugin, endpoints, hosts, isolation=vnid_isolation(endpoints))
    assert plugin == NETWORKPOLICY
    index = ClusterIndex(records, namespace_labels(namespaces, records))
    compiled = sorted((compile_policy(index, p) for p in policies), key=lambda p: p.key)
    return RuleSet(
        plugin,
        endpoints,
        hosts,
        policies=tuple(compiled),
        ingress_isolated=isolated_pods(compiled, INGRESS),
        egress_isolated=isolated_pods(compiled, EGRESS),
    )


def pods_and_hosts(
    plugin: str, pods: Iterable[Obj], netnamespaces: Iterable[Obj], node_ips: Iterable[str] = ()
) -> tuple[list[PodRecord], frozenset[IPv4Address]]:
    """The pod records (sorted by IP) and the host IPs: ``node_ips`` and hostNetwork pods."""
    pod_list = sorted(pods, key=object_key)  # the first pod by key wins a duplicate IP
    records = pod_records(pod_list, _vnid_lookup(plugin, netnamespaces))
    return records, frozenset(_host_ips(pod_list, node_ips))


def isolated_pods(policies: Iterable[CompiledPolicy], direction: str) -> PodSet:
    """The pods some policy isolates for ``direction``: the union of their targets."""
    targets = {p.targets for p in policies if (p.ingress if direction == INGRESS else p.egress)}
    return EMPTY.union(*targets)


# --- pods, namespaces, VNIDs --------------------------------------------------------------


def object_key(obj: Obj) -> tuple[str, str]:
    """(namespace, name) of an API object ("" when absent)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _vnid_lookup(plugin: str, netnamespaces: Iterable[Obj]) -> Mapping[str, int] | None:
    """namespace → VNID; None in subnet mode, where every pod is VNID 0."""
    if plugin == SUBNET:
        return None
    found = {}
    for netns in netnamespaces:
        name = netns.get("netname") or (netns.get("metadata") or {}).get("name")
        if name is not None and netns.get("netid") is not None:
            found[str(name)] = int(netns["netid"])
    return found


def pod_address(value: Any) -> IPv4Address | None:
    """A ``status.podIP`` as an IPv4 address; None when absent, IPv6 or unreadable. An
    ``IPv4Address`` is returned as it is (the incremental compiler keeps one per pod)."""
    if isinstance(value, IPv4Address):
        return value
    try:
        return IPv4Address(str(value or ""))
    except ValueError:
        return None


def _pod_ip(pod: Obj) -> IPv4Address | None:
    return pod_address((pod.get("status") or {}).get("podIP"))


def _is_host_network(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("hostNetwork"))


def _is_running(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def contributes(pod: Obj) -> bool:
    """Whether compile reads anything from ``pod``: an IPv4 address, and running or
    hostNetwork. Any other pod can be left out without changing the rule set."""
    return _pod_ip(pod) is not None and (_is_host_network(pod) or _is_running(pod))


def _host_ips(pods: Sequence[Obj], node_ips: Iterable[str]) -> Iterator[IPv4Address]:
    yield from (IPv4Address(ip) for ip in node_ips)
    for pod in pods:
        ip = _pod_ip(pod) if _is_host_network(pod) else None
        if ip is not None:
            yield ip


def pod_records(pods: Sequence[Obj], vnids: Mapping[str, int] | None) -> list[PodRecord]:
    """The running, pod-network pods with an IPv4 address; the first of a duplicate IP wins."""
    records: dict[IPv4Address, PodRecord] = {}
    for pod in pods:
        ip = _pod_ip(pod)
        if ip is None or ip in records or _is_host_network(pod) or not _is_running(pod):
            continue
        records[ip] = _pod_record(pod, ip, vnids)
    return sorted(records.values(), key=lambda r: r.endpoint.ip)


def _pod_record(pod: Obj, ip: IPv4Address, vnids: Mapping[str, int] | None) -> PodRecord:
    namespace, name = object_key(pod)
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    vnid = GLOBAL_VNID if vnids is None else vnids.get(namespace)
    labels = dict((pod.get("metadata") or {}).get("labels") or {})
    return PodRecord(Endpoint(ip, namespace, name, node, vnid), labels, _named_ports(pod))


def _named_ports(pod: Obj) -> dict[tuple[str, str], int]:
    """(name, protocol) → containerPort over the pod's containers."""
    found = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name"):
                protocol = str(port.get("protocol") or "TCP").upper()
                found[(str(port["name"]), protocol)] = int(port["containerPort"])
    return found


def namespace_labels(
    namespaces: Iterable[Obj], records: Iterable[PodRecord]
) -> dict[str, dict[str, str]]:
    """Every known namespace's labels, with ``kubernetes.io/metadata.name`` added."""
    found = {r.endpoint.namespace: {NAME_LABEL: r.endpoint.namespace} for r in records}
    for ns in namespaces:
        meta = ns.get("metadata") or {}
        name = str(meta.get("name") or "")
        found[name] = {**(meta.get("labels") or {}), NAME_LABEL: name}
    return found


def vnid_isolation(endpoints: Iterable[Endpoint]) -> VnidIsolation:
    """The multitenant map: every pod's VNID, and the pods whose project has none yet."""
    listed = list(endpoints)
    vnids = tuple((e.ip, e.vnid) for e in listed if e.vnid is not None)
    unassigned = frozenset(e.ip for e in listed if e.vnid is None)
    return VnidIsolation(vnids, unassigned)


# --- NetworkPolicy ------------------------------------------------------------------------


def policy_types(spec: Obj) -> tuple[bool, bool]:
    """(ingress, egress): the policyTypes, defaulted as Kubernetes defaults them."""
    types = spec.get("policyTypes") or ["Ingress", *(["Egress"] if spec.get("egress") else [])]
    return "Ingress" in types, "Egress" in types


def compile_policy(index: ClusterIndex, policy: Obj) -> CompiledPolicy:
    """One NetworkPolicy: its selected pods, the directions it isolates, its rules."""
    namespace, name = object_key(policy)
    spec = policy.get("spec") or {}
    selector = label_selector_from_spec(spec.get("podSelector") or {})
    targets = index.select(selector, frozenset([namespace]))
    ingress, egress = policy_types(spec)
    rules = [
        _rule(index, namespace, (f"{namespace}/{name}/{direction}/{i}", direction), rule, targets)
        for direction, wanted in ((INGRESS, ingress), (EGRESS, egress))
        if wanted
        for i, rule in enumerate(spec.get(direction) or [])
    ]
    return CompiledPolicy(namespace, name, ingress, egress, targets, tuple(rules))


def _rule(
    index: ClusterIndex, namespace: str, label: tuple[str, str], rule: Obj, targets: PodSet
) -> PolicyRule:
    """One rule; ``label`` is (``<ns>/<policy>/<direction>/<i>``, direction)."""
    rule_id, direction = label
    peers = _peer_set(index, namespace, rule.get("from" if direction == INGRESS else "to"))
    ports = _port_match(index, rule.get("ports"), targets if direction == INGRESS else peers)
    return PolicyRule(rule_id, direction, targets, peers, ports)


def _peer_set(index: ClusterIndex, namespace: str, peers: Sequence[Obj] | None) -> PeerSet:
    """The union of a rule's peers; none at all means every address."""
    if not peers:
        return PeerSet(True)
    pod_sets: list[PodSet] = []
    intervals: list[Interval] = []
    for peer in peers:
        if peer.get("ipBlock") is not None:
            intervals += ip_block_intervals(peer["ipBlock"])
        else:
            pod_sets.append(_peer_pods(index, namespace, peer))
    pods = pod_sets[0] if len(pod_sets) == 1 else EMPTY.union(*pod_sets)
    return PeerSet(False, pods, to_networks(intervals))


def _peer_pods(index: ClusterIndex, namespace: str, peer: Obj) -> PodSet:
    ns_selector = peer.get("namespaceSelector")
    if ns_selector is None:
        namespaces = frozenset([namespace])
    else:
        namespaces = index.namespaces_matching(label_selector_from_spec(ns_selector))
    return index.select(label_selector_from_spec(peer.get("podSelector")), namespaces)


def _port_match(
    index: ClusterIndex, ports: Sequence[Obj] | None, destinations: PodSet | PeerSet
) -> PortMatch:
    """A rule's ports; named ones resolved on the pods among ``destinations``."""
    if not ports:
        return PortMatch(True)
    ranges: list[PortRange] = []
    names: list[tuple[str, str]] = []
    for port in ports:
        protocol = str(port.get("protocol") or "TCP").upper()
        value = port.get("port")
        if isinstance(value, str):
            names.append((value, protocol))
        else:
            ranges.append(_port_range(protocol, value, port.get("endPort")))
    named = frozenset(_resolve_named(index, names, destinations))
    return PortMatch(False, normalize_ports(ranges), named)


def _port_range(protocol: str, port: int | None, end_port: int | None) -> PortRange:
    if port is None:
        return PortRange(protocol, LOWEST_PORT, HIGHEST_PORT)
    return PortRange(protocol, int(port), int(end_port if end_port is not None else port))


def _resolve_named(
    index: ClusterIndex, names: Iterable[tuple[str, str]], destinations: PodSet | PeerSet
) -> Iterator[NamedPort]:
    for name, protocol in names:
        owners = index.named_ports.get((name, protocol), {})
        for ip in _among(owners, destinations):
            yield NamedPort(ip, protocol, owners[ip], name)


def _among(
    owners: Mapping[IPv4Address, int], destinations: PodSet | PeerSet
) -> Iterator[IPv4Address]:
    """The pods of ``owners`` within ``destinations``, walking the smaller side."""
    if isinstance(destinations, PeerSet):
        if destinations.every_address or destinations.blocks:
            yield from (ip for ip in owners if destinations.contains(ip))
            return
        destinations = destinations.pods
    if len(destinations) < len(owners):
        yield from (ip for ip in destinations if ip in owners)
    else:
        yield from (ip for ip in owners if ip in destinations)
