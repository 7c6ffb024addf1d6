"""Which pods a selector picks, fast: pods indexed by namespace, label key and label value.

A selector's pods are set operations over the index (``In``: a union of value sets,
``Exists``: the key's set, ``NotIn`` and ``DoesNotExist``: taken away from the rest), not
a scan of every pod, and each answer is cached, since policies repeat their selectors.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import TypeVar

from podnet.model.selectors import DOES_NOT_EXIST, EXISTS, IN, NOT_IN, LabelSelector, Requirement
from podnet.policy.model import Endpoint

PodSet = frozenset[IPv4Address]
NamedPortKey = tuple[str, str]  # (port name, protocol)
EMPTY: PodSet = frozenset()
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class PodRecord:
    """A pod to compile: its endpoint, labels and named container ports."""

    endpoint: Endpoint
    labels: Mapping[str, str]
    named_ports: Mapping[NamedPortKey, int]  # (name, protocol) → containerPort


class ClusterIndex:
    """Pods by namespace, label key and (key, value); named ports by (name, protocol)."""

    def __init__(
        self, records: Sequence[PodRecord], namespace_labels: Mapping[str, Mapping[str, str]]
    ) -> None:
        self.everyone: PodSet = frozenset(r.endpoint.ip for r in records)
        self.namespace_labels = namespace_labels
        self.labels = {r.endpoint.ip: r.labels for r in records}
        self.named_ports = _named_port_index(records)
        self._by_namespace = _freeze(_group(records, lambda r: [r.endpoint.namespace]))
        self._by_key = _freeze(_group(records, lambda r: list(r.labels)))
        self._by_value = _freeze(_group(records, lambda r: list(r.labels.items())))
        self._selected: dict[LabelSelector, PodSet] = {}
        self._namespaces: dict[LabelSelector, frozenset[str]] = {}
        self._in_namespaces: dict[frozenset[str], PodSet] = {}
        self._peers: dict[tuple[LabelSelector, frozenset[str]], PodSet] = {}

    def namespaces_matching(self, selector: LabelSelector) -> frozenset[str]:
        """The namespaces whose labels ``selector`` matches (cached)."""
        found = self._namespaces.get(selector)
        if found is None:
            labels = self.namespace_labels
            found = frozenset(ns for ns in labels if selector.matches(labels[ns]))
            self._namespaces[selector] = found
        return found

    def in_namespaces(self, namespaces: frozenset[str]) -> PodSet:
        """Every pod in these namespaces (cached)."""
        found = self._in_namespaces.get(namespaces)
        if found is None:
            found = EMPTY.union(*(self._by_namespace.get(ns, EMPTY) for ns in namespaces))
            self._in_namespaces[namespaces] = found
        return found

    def select(self, selector: LabelSelector, namespaces: frozenset[str]) -> PodSet:
        """The pods in ``namespaces`` that ``selector`` matches (cached)."""
        key = (selector, namespaces)
        found = self._peers.get(key)
        if found is None:
            scope = self.in_namespaces(namespaces)
            found = scope if selector.is_empty() else self.matching(selector) & scope
            self._peers[key] = found
        return found

    def matching(self, selector: LabelSelector) -> PodSet:
        """The pods of the whole cluster that ``selector`` matches (cached)."""
        found = self._selected.get(selector)
        if found is None:
            found = self._evaluate(selector)
            self._selected[selector] = found
        return found

    def _evaluate(self, selector: LabelSelector) -> PodSet:
        """Intersect the positive requirements (smallest first), then take out the rest."""
        wanted: list[PodSet] = []
        unwanted: list[PodSet] = []
        for requirement in selector.requirements:
            positive, pods = self._requirement_pods(requirement)
            (wanted if positive else unwanted).append(pods)
        wanted.sort(key=len)
        result = wanted[0].intersection(*wanted[1:]) if wanted else self.everyone
        return frozenset(result.difference(*unwanted)) if unwanted else frozenset(result)

    def _requirement_pods(self, requirement: Requirement) -> tuple[bool, PodSet]:
        """(True, pods meeting it) or (False, pods failing it), whichever is the index's."""
        key, operator = requirement.key, requirement.operator
        if operator in (IN, NOT_IN):
            by_value = self._by_value
            pods = EMPTY.union(*(by_value.get((key, v), EMPTY) for v in requirement.values))
            return operator == IN, pods
        if operator in (EXISTS, DOES_NOT_EXIST):
            return operator == EXISTS, self._by_key.get(key, EMPTY)
        labels = self.labels  # Gt / Lt: no index, ask each pod
        return True, frozenset(ip for ip in self.everyone if requirement.matches(labels[ip]))


def _group(
    records: Sequence[PodRecord], keys: Callable[[PodRecord], list[K]]
) -> dict[K, list[IPv4Address]]:
    """Pod IPs grouped under each key that ``keys`` gives for a pod."""
    groups: dict[K, list[IPv4Address]] = defaultdict(list)
    for record in records:
        for key in keys(record):
            groups[key].append(record.endpoint.ip)
    return groups


def _freeze(groups: Mapping[K, list[IPv4Address]]) -> dict[K, PodSet]:
    return {key: frozenset(ips) for key, ips in groups.items()}


def _named_port_index(records: Sequence[PodRecord]) -> dict[NamedPortKey, dict[IPv4Address, int]]:
    """(name, protocol) → {pod IP: containerPort}, for resolving named ports per pod."""
    index: dict[NamedPortKey, dict[IPv4Address, int]] = defaultdict(dict)
    for record in records:
        for named, port in record.named_ports.items():
            index[named][record.endpoint.ip] = port
    return dict(index)
