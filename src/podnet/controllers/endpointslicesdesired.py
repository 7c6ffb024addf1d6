"""The EndpointSlices a Service should have, from the Service and its pods (pure).

As Kubernetes' EndpointSlice controller, for a Service that ``manages`` says is ours:

- one family of slices per address type of the Service (``spec.ipFamilies``, else the
  family of its cluster IP, else IPv4), holding the pod addresses of that family;
- endpoints grouped by their resolved port set (a named ``targetPort`` may resolve to
  different numbers on different pods), at most ``MAX_ENDPOINTS_PER_SLICE`` a slice;
- conditions: ``ready`` (Ready, or ``publishNotReadyAddresses``; never while terminating
  unless published), ``serving`` (Ready), ``terminating`` (being deleted); terminating pods
  stay in slices so a proxy can drain them;
- a Service no pod matches still gets one empty placeholder slice, so readers can tell
  "processed, no endpoints" from "not processed yet";
- labels ``kubernetes.io/service-name`` and ``endpointslice.kubernetes.io/managed-by``
  (plus the Service's own labels), and an owner reference to the Service.

Slice names are ``<service>-<hash>``, the hash of address type, port set and chunk index,
so the same inputs always give the same names and the controller can compare by name.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from podnet.controllers.endpointsdesired import (
    Obj,
    is_ready,
    is_terminating,
    meta_of,
    owned_labels,
    pod_counts,
    pod_identity,
    pod_ips,
    ports_key,
    publishes_not_ready,
    resolved_ports,
    selects,
    spec_of,
)
from podnet.model.schemas_discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL

SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
MAX_ENDPOINTS_PER_SLICE = 100
_NAME_HASH = 10


def address_types(service: Obj) -> list[str]:
    """The slices' address types: the Service's IP families, in order."""
    spec = spec_of(service)
    families = [f for f in spec.get("ipFamilies") or [] if f in ("IPv4", "IPv6")]
    if families:
        return families
    cluster_ip = str(spec.get("clusterIP") or "")
    return ["IPv6"] if ":" in cluster_ip else ["IPv4"]


def _family(ip: str) -> str:
    return "IPv6" if ":" in ip else "IPv4"


def slice_endpoint(service: Obj, pod: Obj, addresses: list[str]) -> dict[str, Any]:
    """One pod as a slice endpoint (kube's podToEndpoint)."""
    published = publishes_not_ready(service)
    terminating = is_terminating(pod)
    serving = is_ready(pod)
    # As kube: never ready while terminating, unless not-ready addresses are published.
    ready = published or (serving and not terminating)
    return {
        "addresses": addresses,
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
        **pod_identity(service, pod),
    }


def _groups(service: Obj, pods: Iterable[Obj]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Endpoints by (address type, ports key)."""
    types = address_types(service)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in pods:
        if not selects(service, pod) or not pod_counts(pod, include_terminating=True):
            continue
        key = ports_key(resolved_ports(service, pod))
        for address_type in types:
            addresses = [ip for ip in pod_ips(pod) if _family(ip) == address_type]
            if addresses:
                endpoint = slice_endpoint(service, pod, addresses[:1])
                groups.setdefault((address_type, key), []).append(endpoint)
    return groups


def slice_name(service: Obj, address_type: str, key: str, index: int) -> str:
    """``<service>-<hash>``: the same for the same address type, ports and chunk."""
    text = json.dumps([address_type, key, index])
    digest = hashlib.sha256(text.encode()).hexdigest()[:_NAME_HASH]
    return f"{meta_of(service).get('name')}-{digest}"


def _owner(service: Obj) -> dict[str, Any]:
    meta = meta_of(service)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "name": str(meta.get("name")),
        "uid": str(meta.get("uid") or ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _slice(
    service: Obj, name: str, address_type: str, ports: list[Any], endpoints: list[Any]
) -> dict[str, Any]:
    meta = meta_of(service)
    labels = owned_labels(
        service, {SERVICE_NAME_LABEL: str(meta.get("name")), MANAGED_BY_LABEL: SLICE_CONTROLLER}
    )
    metadata: dict[str, Any] = {"name": name, "namespace": meta.get("namespace"), "labels": labels}
    if meta.get("uid"):
        metadata["ownerReferences"] = [_owner(service)]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports,
    }


def desired_slices(service: Obj, pods: Iterable[Obj]) -> dict[str, dict[str, Any]]:
    """Every EndpointSlice the controller keeps for ``service``, by name."""
    out: dict[str, dict[str, Any]] = {}
    for (address_type, key), endpoints in sorted(_groups(service, pods).items()):
        endpoints.sort(key=lambda e: (e["addresses"], e["targetRef"]["name"]))
        ports = json.loads(key)
        for index in range(0, len(endpoints), MAX_ENDPOINTS_PER_SLICE):
            chunk = endpoints[index : index + MAX_ENDPOINTS_PER_SLICE]
            name = slice_name(service, address_type, key, index // MAX_ENDPOINTS_PER_SLICE)
            out[name] = _slice(service, name, address_type, ports, chunk)
    if not out:
        address_type = address_types(service)[0]
        name = slice_name(service, address_type, "placeholder", 0)
        out[name] = _slice(service, name, address_type, [], [])
    return out


_OWNED_FIELDS = ("addressType", "endpoints", "ports")


def slice_differs(current: Obj, desired: Obj) -> bool:
    """Whether a stored slice differs from the desired in what the controller owns."""
    if any((current.get(f) or []) != (desired.get(f) or []) for f in _OWNED_FIELDS):
        return True
    cur, want = meta_of(current), meta_of(desired)
    return (cur.get("labels") or {}) != want.get("labels") or (
        cur.get("ownerReferences") or []
    ) != (want.get("ownerReferences") or [])


def is_managed_slice(obj: Obj) -> bool:
    """Whether the controller wrote this slice (and may change or delete it)."""
    labels: Mapping[str, Any] = meta_of(obj).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) == SLICE_CONTROLLER


def service_name_of(obj: Obj) -> str | None:
    """The Service a slice belongs to (its ``kubernetes.io/service-name`` label)."""
    labels: Mapping[str, Any] = meta_of(obj).get("labels") or {}
    name = labels.get(SERVICE_NAME_LABEL)
    return str(name) if name else None
