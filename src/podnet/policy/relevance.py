"""Which NetworkPolicies a changed pod can affect, without compiling them.

A compiled policy reads pods only through its selections: its targets (pods of its
namespace matching ``podSelector``), the pod peers of each rule (pods matching a
``podSelector`` in the namespaces a ``namespaceSelector`` picks, or the policy's own), and
the named ports it resolves (on its targets for ingress, on its peers for egress, which
with ``ipBlock`` or "every address" peers can be any pod). A pod that neither matched
nor matches any of them, before or after its change, leaves the policy's compiled form
as it was, so ``PolicyCompiler`` keeps it instead of compiling it again.

Conservative by design: ``touches`` may say True for a pod that changes nothing, never
False for one that changes something. The property test of ``PolicyCompiler`` (equal to
``compile_rules`` after random changes) holds it to that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podnet.model.selectors import LabelSelector, label_selector_from_spec

Obj = Mapping[str, Any]
NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class _Peer:
    namespaces: LabelSelector | None  # None: the policy's own namespace
    pods: LabelSelector


@dataclass(frozen=True)
class PolicyShape:
    """A policy's selections, parsed once."""

    namespace: str
    targets: LabelSelector
    peers: tuple[_Peer, ...]
    any_pod_named: bool  # named ports resolved among every pod (ipBlock / every address)

    @classmethod
    def of(cls, policy: Obj) -> PolicyShape:
        """The shape of a (slim) NetworkPolicy."""
        namespace = str((policy.get("metadata") or {}).get("namespace") or "")
        spec = policy.get("spec") or {}
        peers: list[_Peer] = []
        any_pod_named = False
        for direction, side in (("ingress", "from"), ("egress", "to")):
            for rule in spec.get(direction) or []:
                named = any(isinstance(p.get("port"), str) for p in rule.get("ports") or [])
                listed = rule.get(side) or []
                if named and direction == "egress":
                    wide = not listed or any(p.get("ipBlock") is not None for p in listed)
                    any_pod_named = any_pod_named or wide
                for peer in listed:
                    if peer.get("ipBlock") is None:
                        peers.append(_peer(peer))
        targets = label_selector_from_spec(spec.get("podSelector") or {})
        return cls(namespace, targets, tuple(peers), any_pod_named)

    def changed_by(
        self, old: Obj | None, new: Obj | None, namespace_labels: Mapping[str, Mapping[str, str]]
    ) -> bool:
        """Whether a pod going from ``old`` to ``new`` (None: absent) can change this
        policy's compiled form. A pod that keeps its address and named ports changes it
        only by entering or leaving one of its selections."""
        if old is None or new is None or _identity(old) != _identity(new):
            return any(self.touches(p, namespace_labels) for p in (old, new) if p is not None)
        return self._membership(old, namespace_labels) != self._membership(new, namespace_labels)

    def _membership(
        self, pod: Obj, namespace_labels: Mapping[str, Mapping[str, str]]
    ) -> tuple[bool, ...]:
        meta = pod.get("metadata") or {}
        pod_ns = str(meta.get("namespace") or "")
        labels = meta.get("labels") or {}
        ns_labels = namespace_labels.get(pod_ns) or {NAME_LABEL: pod_ns}
        target = pod_ns == self.namespace and self.targets.matches(labels)
        peers = (
            (pod_ns == self.namespace if p.namespaces is None else p.namespaces.matches(ns_labels))
            and p.pods.matches(labels)
            for p in self.peers
        )
        return (target, *peers)

    def touches(self, pod: Obj, namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
        """Whether ``pod`` (one version of it) is or would be selected by this policy."""
        meta = pod.get("metadata") or {}
        pod_ns = str(meta.get("namespace") or "")
        labels = meta.get("labels") or {}
        if pod_ns == self.namespace and self.targets.matches(labels):
            return True
        if self.any_pod_named and _has_named_ports(pod):
            return True
        ns_labels = namespace_labels.get(pod_ns) or {NAME_LABEL: pod_ns}
        return any(
            (pod_ns == self.namespace if p.namespaces is None else p.namespaces.matches(ns_labels))
            and p.pods.matches(labels)
            for p in self.peers
        )


def _peer(peer: Obj) -> _Peer:
    namespaces = peer.get("namespaceSelector")
    selector = None if namespaces is None else label_selector_from_spec(namespaces)
    return _Peer(selector, label_selector_from_spec(peer.get("podSelector")))


def _identity(pod: Obj) -> tuple[Any, ...]:
    """What a pod gives a policy besides its labels: address, state, named ports."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = spec.get("containers") or []
    ports = [port for c in containers for port in c.get("ports") or []]
    return (status.get("podIP"), status.get("phase"), spec.get("hostNetwork"), repr(ports))


def _has_named_ports(pod: Obj) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(port.get("name") for c in containers for port in c.get("ports") or [])
