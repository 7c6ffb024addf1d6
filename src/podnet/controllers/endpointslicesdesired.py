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
    PortsKey,
    address_types,
    family,
    is_ready,
    is_terminating,
    labels_of,
    meta_of,
    owned_labels,
    pod_counts,
    pod_identity,
    pod_ips,
    ports_key,
    ports_of,
    publishes_not_ready,
    resolved_ports,
    selects,
)
from podnet.controllers.endpointslicepacking import pack
from podnet.model.schemas_discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL

SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
MIRROR_CONTROLLER = "endpointslicemirroring-controller.k8s.io"
MAX_ENDPOINTS_PER_SLICE = 100
Groups = dict[tuple[str, PortsKey], list[dict[str, Any]]]  # (address type, ports) -> endpoints
_NAME_HASH = 10


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


def _groups(service: Obj, pods: Iterable[Obj]) -> Groups:
    """Endpoints by (address type, ports key)."""
    types = address_types(service)
    groups: Groups = {}
    for pod in pods:
        if not selects(service, pod) or not pod_counts(pod, include_terminating=True):
            continue
        key = ports_key(resolved_ports(service, pod))
        for address_type in types:
            addresses = [ip for ip in pod_ips(pod) if family(ip) == address_type]
            if addresses:
                endpoint = slice_endpoint(service, pod, addresses[:1])
                groups.setdefault((address_type, key), []).append(endpoint)
    return groups


def slice_name(
    service_name: str, managed_by: str, address_type: str, key: PortsKey, index: int
) -> str:
    """``<service>-<hash>``: the same for the same writer, address type, ports and chunk."""
    text = json.dumps([managed_by, address_type, key, index])
    digest = hashlib.sha256(text.encode()).hexdigest()[:_NAME_HASH]
    return f"{service_name}-{digest}"


def owner_reference(owner: Obj) -> dict[str, Any]:
    """A controller reference to ``owner`` (a Service, or mirrored Endpoints)."""
    meta = meta_of(owner)
    return {
        "apiVersion": str(owner.get("apiVersion") or "v1"),
        "kind": str(owner.get("kind")),
        "name": str(meta.get("name")),
        "uid": str(meta.get("uid") or ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_slices(
    owner: Obj,
    managed_by: str,
    labels: dict[str, str],
    groups: Groups,
    placeholder: str | None,
    current: Iterable[Obj] = (),
) -> dict[str, dict[str, Any]]:
    """The slices holding ``groups``, at most ``MAX_ENDPOINTS_PER_SLICE`` endpoints each,
    packed into the ``current`` slices first (``endpointslicepacking``), labelled with
    ``labels``, the service name and ``managed_by``, owned by ``owner``; one empty slice
    of address type ``placeholder`` when there is no endpoint at all."""
    meta = meta_of(owner)
    service = str(meta.get("name"))
    labels = {**labels, SERVICE_NAME_LABEL: service, MANAGED_BY_LABEL: managed_by}
    metadata: dict[str, Any] = {"namespace": meta.get("namespace"), "labels": labels}
    if meta.get("uid"):
        metadata["ownerReferences"] = [owner_reference(owner)]

    def name_for(address_type: str, key: PortsKey, index: int) -> str:
        return slice_name(service, managed_by, address_type, key, index)

    chunks = pack(groups, current, name_for, MAX_ENDPOINTS_PER_SLICE)
    if not chunks and placeholder:
        chunks = [(placeholder, (), name_for(placeholder, (), -1), [])]
    out: dict[str, dict[str, Any]] = {}
    for address_type, key, name, chunk in chunks:
        slice_meta: dict[str, Any] = {"name": name, **metadata}
        out[name] = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": slice_meta,
            "addressType": address_type,
            "endpoints": chunk,
            "ports": ports_of(key),
        }
    return out


def desired_slices(
    service: Obj, pods: Iterable[Obj], current: Iterable[Obj] = ()
) -> dict[str, dict[str, Any]]:
    """Every EndpointSlice the controller keeps for ``service``, by name, packed into the
    ``current`` slices (the ones it wrote before) where they have room."""
    groups = _groups(service, pods)
    labels = owned_labels(service, {})
    owner = {**service, "apiVersion": "v1", "kind": "Service"}
    ours = [s for s in current if labels_of(s).get(MANAGED_BY_LABEL) == SLICE_CONTROLLER]
    return build_slices(owner, SLICE_CONTROLLER, labels, groups, address_types(service)[0], ours)


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
    """Whether the controller wrote this slice, from pods or mirrored from hand-written
    Endpoints (and may change or delete it)."""
    labels: Mapping[str, Any] = meta_of(obj).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) in (SLICE_CONTROLLER, MIRROR_CONTROLLER)


def service_name_of(obj: Obj) -> str | None:
    """The Service a slice belongs to (its ``kubernetes.io/service-name`` label)."""
    labels: Mapping[str, Any] = meta_of(obj).get("labels") or {}
    name = labels.get(SERVICE_NAME_LABEL)
    return str(name) if name else None
