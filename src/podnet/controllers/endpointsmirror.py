"""EndpointSlices mirrored from hand-written Endpoints (pure), as Kubernetes' EndpointSlice
mirroring controller does, so that readers of slices (the service proxy, DNS) also see
Services without a selector.

A Service is mirrored when it has no selector, is not ExternalName, and its Endpoints
were written by its users (not by the endpoints controller) and do not carry
``endpointslice.kubernetes.io/skip-mirror: "true"``. Each subset's ready addresses
become endpoints with ``ready: true``, its not-ready ones ``ready: false`` (at most
``MAX_MIRRORED_PER_SUBSET`` a subset), grouped by address family and port set; the
slices carry the Endpoints' labels, ``managed-by: endpointslicemirroring-controller.k8s.io``
and a controller reference to the Endpoints. Endpoints without addresses get no slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from podnet.controllers.endpointsdesired import (
    Obj,
    endpoint_port,
    family,
    is_managed_endpoints,
    labels_of,
    ports_key,
    selector_of,
    spec_of,
)
from podnet.controllers.endpointslicesdesired import MIRROR_CONTROLLER, Groups, build_slices
from podnet.model.schemas_discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL

SKIP_MIRROR_LABEL = "endpointslice.kubernetes.io/skip-mirror"
MAX_MIRRORED_PER_SUBSET = 1000
_COPIED = ("hostname", "nodeName", "targetRef")


def mirrors(service: Obj, endpoints: Obj | None) -> bool:
    """Whether ``endpoints`` (of ``service``) are mirrored into slices."""
    if endpoints is None or selector_of(service):
        return False
    if spec_of(service).get("type") == "ExternalName" or is_managed_endpoints(endpoints):
        return False
    return labels_of(endpoints).get(SKIP_MIRROR_LABEL) != "true"


def _endpoint(address: Obj, ready: bool) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"addresses": [address["ip"]], "conditions": {"ready": ready}}
    endpoint.update({f: address[f] for f in _COPIED if address.get(f)})
    return endpoint


def _subset_endpoints(subset: Obj) -> list[dict[str, Any]]:
    listed = [(a, True) for a in subset.get("addresses") or []]
    listed += [(a, False) for a in subset.get("notReadyAddresses") or []]
    return [_endpoint(a, ready) for a, ready in listed[:MAX_MIRRORED_PER_SUBSET]]


def mirrored_slices(endpoints: Obj, current: Iterable[Obj] = ()) -> dict[str, dict[str, Any]]:
    """The slices mirroring ``endpoints``, by name (packed into ``current`` ones)."""
    groups: Groups = {}
    for subset in endpoints.get("subsets") or []:
        key = ports_key(endpoint_port(p, int(p["port"])) for p in subset.get("ports") or [])
        for endpoint in _subset_endpoints(subset):
            groups.setdefault((family(endpoint["addresses"][0]), key), []).append(endpoint)
    reserved = (MANAGED_BY_LABEL, SERVICE_NAME_LABEL)
    labels = {k: v for k, v in labels_of(endpoints).items() if k not in reserved}
    owner = {**endpoints, "apiVersion": "v1", "kind": "Endpoints"}
    ours = [s for s in current if labels_of(s).get(MANAGED_BY_LABEL) == MIRROR_CONTROLLER]
    return build_slices(owner, MIRROR_CONTROLLER, labels, groups, None, ours)
