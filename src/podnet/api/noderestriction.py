"""NodeRestriction: what a node may put in the objects it writes (pure, no I/O).

The rules that look at objects, after the authorizer's verb/resource rules passed. They
follow kube's NodeRestriction admission plugin, and go one step further for pods,
because podnet's NetworkPolicy selects pods by label:

- Pods. A node creates only *mirror* pods (annotation ``kubernetes.io/config.mirror``)
  bound to itself (``spec.nodeName``), with no labels at all, so a pod a node makes can
  never enter a policy's label selection; at most one owner reference, and only a
  controller reference to its own Node (kube's form); no service account, secret,
  config map or claim reference. It never updates or patches a pod itself (the
  authorizer allows only ``pods/status``); a status write must be for a pod bound to it,
  and the status subresource ignores every change outside ``status`` (kube's
  ``ResetObjectMetaForStatus``), which is checked again here: labels, annotations,
  owners and spec must come out unchanged. It deletes only pods bound to it, and of
  those only its mirror pods and pods already being deleted (it finalizes them).
- Node. Only its own; it may not add, change or remove labels under
  ``node-restriction.kubernetes.io/`` (or a subdomain of it), nor ``kubernetes.io``/
  ``k8s.io`` labels outside the kubelet's own set; it may not change its taints. The
  underlay MAC it publishes (``podnet.io/underlay-mac``) must be a usable MAC.
- Lease. Only the one named after itself, in ``kube-node-lease``.
- Event. If it names a reporting host, that host is the node itself.

The checks that need the registry (pod IPs inside the node's HostSubnet, an owner
reference's UID, event quotas) are in ``podnet.api.admission``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podnet.model.kinds import Kind
from podnet.model.underlaymac import UNDERLAY_MAC_ANNOTATION, mac_problem

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
LEASE_GROUP = "coordination.k8s.io"
LEASE_PLURAL = "leases"
NODE_LEASE_NAMESPACE = "kube-node-lease"
RESTRICTED_LABEL_DOMAIN = "node-restriction.kubernetes.io"
_KUBELET_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "node.kubernetes.io/windows-build",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
    }
)
_KUBELET_LABEL_DOMAINS = ("kubelet.kubernetes.io", "node.kubernetes.io")
_POD_REFERENCES = ("secret", "configMap", "persistentVolumeClaim", "projected")

Obj = Mapping[str, Any]


def _get(obj: Obj | None, *path: str) -> Any:
    node: Any = obj
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _in_domain(domain: str, parent: str) -> bool:
    return domain == parent or domain.endswith("." + parent)


def forbidden_node_label(key: str) -> bool:
    """Whether a node may not set, change or remove this label on its Node (kube's list)."""
    domain = key.split("/", 1)[0] if "/" in key else ""
    if _in_domain(domain, RESTRICTED_LABEL_DOMAIN):
        return True
    kubernetes = _in_domain(domain, "kubernetes.io") or _in_domain(domain, "k8s.io")
    kubelet = key in _KUBELET_LABELS or any(_in_domain(domain, d) for d in _KUBELET_LABEL_DOMAINS)
    return kubernetes and not kubelet


def changed_labels(new: Obj | None, old: Obj | None) -> set[str]:
    """Label keys added, removed or changed between two objects."""
    a = _get(new, "metadata", "labels") or {}
    b = _get(old, "metadata", "labels") or {}
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}


def node_restriction(
    node: str,
    verb: str,
    kind: Kind,
    subresource: str | None,
    namespace: str | None,
    new: Obj | None,
    old: Obj | None,
) -> str | None:
    """Why node ``node`` may not make this write, or None (see the module doc)."""
    key = (kind.group, kind.plural)
    if key == ("", "pods"):
        return _pod(node, verb, subresource, new, old)
    if key == ("", "nodes"):
        return _node(node, verb, new, old)
    if key == (LEASE_GROUP, LEASE_PLURAL):
        return _lease(node, verb, namespace, new)
    if key == ("", "events"):
        host = _get(new, "source", "host")
        if host not in (None, node):
            return f'a node may only report events as itself: source.host is "{host}"'
    return None


# ---- pods ---------------------------------------------------------------------------------


def _bound(obj: Obj | None) -> str | None:
    bound = _get(obj, "spec", "nodeName")
    return bound if isinstance(bound, str) else None


def _not_bound(node: str, obj: Obj | None, action: str) -> str | None:
    bound = _bound(obj)
    if bound == node:
        return None
    where = f'on node "{bound}"' if bound else "not bound to a node"
    return f"a node may only {action} pods bound to it, this pod is {where}"


def _pod(node: str, verb: str, sub: str | None, new: Obj | None, old: Obj | None) -> str | None:
    if verb == "delete":
        if old is None:
            return "a node may only delete pods bound to it: the pod's node is unknown"
        return _not_bound(node, old, "delete") or _finalizable(old)
    if new is None:
        return f"a node may only {verb} pods bound to it: no object given"
    if verb == "create":
        return _not_bound(node, new, "create") or _mirror_pod(node, new)
    if old is None:
        return f"a node may only {verb} pods bound to it: the stored pod is unknown"
    return (
        _not_bound(node, old, "update") or _not_bound(node, new, "update") or _status_only(new, old)
    )


def _finalizable(pod: Obj) -> str | None:
    """A node removes only its mirror pods and pods being deleted (it finalizes them)."""
    if _get(pod, "metadata", "deletionTimestamp"):
        return None
    if MIRROR_ANNOTATION in (_get(pod, "metadata", "annotations") or {}):
        return None
    return "a node may only delete its mirror pods and pods already being deleted"


def _mirror_pod(node: str, pod: Obj) -> str | None:
    annotations = _get(pod, "metadata", "annotations") or {}
    if MIRROR_ANNOTATION not in annotations:
        return (
            f'a node may only create mirror pods: the pod has no "{MIRROR_ANNOTATION}" annotation'
        )
    if _get(pod, "metadata", "labels"):
        return "a node may not create pods with labels: labels are what NetworkPolicies select on"
    owners = _get(pod, "metadata", "ownerReferences") or []
    if owners and (len(owners) > 1 or not _owned_by_node(node, owners[0])):
        return (
            "a node may only create pods whose single owner reference is a controller "
            f'reference to its own Node "{node}" (without blockOwnerDeletion)'
        )
    spec = _get(pod, "spec") or {}
    if spec.get("serviceAccountName") or spec.get("serviceAccount"):
        return "a node may not create pods that reference a service account"
    for volume in spec.get("volumes") or []:
        if isinstance(volume, Mapping) and any(ref in volume for ref in _POD_REFERENCES):
            return (
                "a node may not create pods that reference secrets, config maps, "
                "projected sources or persistent volume claims"
            )
    return None


def _owned_by_node(node: str, owner: Any) -> bool:
    if not isinstance(owner, Mapping):
        return False
    return (
        owner.get("apiVersion") == "v1"
        and owner.get("kind") == "Node"
        and owner.get("name") == node
        and owner.get("controller") is True
        and not owner.get("blockOwnerDeletion")
    )


def _status_only(new: Obj, old: Obj) -> str | None:
    """A status write changes nothing but status (the subresource ignores the rest)."""
    if changed_labels(new, old):
        return "a node may not change a pod's labels"
    for part in ("annotations", "ownerReferences", "finalizers"):
        if _get(new, "metadata", part) != _get(old, "metadata", part):
            return f"a node may not change a pod's metadata.{part}"
    if _get(new, "spec") != _get(old, "spec"):
        return "a node may not change a pod's spec"
    return None


# ---- nodes and leases -----------------------------------------------------------------------


def _node(node: str, verb: str, new: Obj | None, old: Obj | None) -> str | None:
    if new is None:
        return f"a node may only {verb} its own Node: no object given"
    name = _get(new, "metadata", "name")
    if verb == "create" and name is None:
        return "a node may only create its own Node: the object has no metadata.name"
    if name is not None and name != node:
        return "a node may only modify its own Node"
    forbidden = sorted(k for k in changed_labels(new, old) if forbidden_node_label(k))
    if forbidden:
        return f"a node may not set, change or remove the labels {', '.join(forbidden)}"
    if old is not None and _get(new, "spec", "taints") != _get(old, "spec", "taints"):
        return "a node may not modify its taints"
    mac = _get(new, "metadata", "annotations", UNDERLAY_MAC_ANNOTATION)
    if mac is not None and mac != _get(old, "metadata", "annotations", UNDERLAY_MAC_ANNOTATION):
        problem = mac_problem(mac)
        if problem:
            return f"{UNDERLAY_MAC_ANNOTATION}: {problem}"
    return None


def _lease(node: str, verb: str, namespace: str | None, new: Obj | None) -> str | None:
    if namespace != NODE_LEASE_NAMESPACE:
        return f"a node may only use leases in the namespace {NODE_LEASE_NAMESPACE}"
    if verb == "create" and _get(new, "metadata", "name") != node:
        return f"a node may only create its own Lease, named {node}"
    return None
