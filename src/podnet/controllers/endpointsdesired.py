"""The Endpoints (v1) a Service should have, from the Service and its pods (pure).

Kubernetes' endpoints controller is the reference, rule for rule:

- only a Service with a selector that is not ExternalName gets endpoints (``manages``);
  a selectorless one keeps the Endpoints its users write;
- a pod counts when the selector matches it in the Service's namespace, it has an IP, it
  is not finished (as its restart policy says) and not terminating, unless the Service
  publishes not-ready addresses (``pod_counts``);
- each Service port resolves per pod (``target_port``): a number as is, a name through
  the pod's container ports of the same protocol; a pod without it is left out for that
  port;
- a ready pod (condition ``Ready`` True), or any pod with ``publishNotReadyAddresses``,
  goes to ``addresses``, the others to ``notReadyAddresses``;
- addresses with the same set of ports share one subset ("repacking"), so two pods that
  map one port name to different numbers end up in two subsets;
- a pod whose ``spec.subdomain`` is the Service's name gets ``hostname`` = its
  ``spec.hostname``; a headless Service without ports still lists its pods;
- more than 1000 addresses are cut to 1000, ready ones first, and the Endpoints say so in
  the ``endpoints.kubernetes.io/over-capacity`` annotation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Obj = Mapping[str, Any]

ENDPOINTS_MANAGED_BY = "endpoints.kubernetes.io/managed-by"
ENDPOINTS_CONTROLLER = "endpoint-controller"
HEADLESS_LABEL = "service.kubernetes.io/headless"
OVER_CAPACITY = "endpoints.kubernetes.io/over-capacity"
MAX_ENDPOINTS_ADDRESSES = 1000


# --- the Service -------------------------------------------------------------------------


def spec_of(obj: Obj) -> Obj:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def meta_of(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def labels_of(obj: Obj) -> dict[str, str]:
    return dict(meta_of(obj).get("labels") or {})


def selector_of(service: Obj) -> dict[str, str]:
    """The Service's selector; empty when it has none (``{}`` decodes to none in kube)."""
    return dict(spec_of(service).get("selector") or {})


def manages(service: Obj) -> bool:
    """Whether the controller computes this Service's endpoints."""
    spec = spec_of(service)
    return bool(selector_of(service)) and spec.get("type") != "ExternalName"


def is_headless(service: Obj) -> bool:
    return spec_of(service).get("clusterIP") == "None"


def address_types(service: Obj) -> list[str]:
    """The Service's IP families, in order (the slices' address types)."""
    spec = spec_of(service)
    families = [f for f in spec.get("ipFamilies") or [] if f in ("IPv4", "IPv6")]
    if families:
        return families
    cluster_ip = str(spec.get("clusterIP") or "")
    return ["IPv6"] if ":" in cluster_ip else ["IPv4"]


def family(ip: str) -> str:
    """``IPv4`` or ``IPv6``: an address's family, as address types name it."""
    return "IPv6" if ":" in ip else "IPv4"


def publishes_not_ready(service: Obj) -> bool:
    return bool(spec_of(service).get("publishNotReadyAddresses"))


def service_ports(service: Obj) -> list[Obj]:
    return [p for p in spec_of(service).get("ports") or [] if isinstance(p, dict)]


def owned_labels(service: Obj, extra: Mapping[str, str]) -> dict[str, str]:
    """The labels of what the controller writes for ``service``: the Service's own, the
    headless marker when it is headless, then ``extra``."""
    labels = labels_of(service)
    if is_headless(service):
        labels[HEADLESS_LABEL] = ""
    labels.update(extra)
    return labels


# --- a pod -------------------------------------------------------------------------------


def selects(service: Obj, pod: Obj) -> bool:
    """Whether ``service``'s selector matches ``pod`` (same namespace, labels superset)."""
    if meta_of(pod).get("namespace") != meta_of(service).get("namespace"):
        return False
    selector = selector_of(service)
    labels = labels_of(pod)
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_ips(pod: Obj) -> list[str]:
    """The pod's addresses: ``status.podIPs``, else ``status.podIP``."""
    status = pod.get("status") or {}
    ips = [str(p["ip"]) for p in status.get("podIPs") or [] if p.get("ip")]
    if not ips and status.get("podIP"):
        ips = [str(status["podIP"])]
    return ips


def is_ready(pod: Obj) -> bool:
    """Whether the pod's ``Ready`` condition is True (kube's IsPodReady)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def is_terminating(pod: Obj) -> bool:
    return bool(meta_of(pod).get("deletionTimestamp"))


def is_finished(pod: Obj) -> bool:
    """Whether the pod ran to an end it will not restart from (kube's restart policies)."""
    phase = (pod.get("status") or {}).get("phase")
    policy = spec_of(pod).get("restartPolicy") or "Always"
    if policy == "Never":
        return phase in ("Succeeded", "Failed")
    if policy == "OnFailure":
        return phase == "Succeeded"
    return False


def pod_counts(pod: Obj, include_terminating: bool) -> bool:
    """Whether the pod belongs in endpoints at all (kube's ShouldPodBeInEndpoints)."""
    if not pod_ips(pod) or is_finished(pod):
        return False
    return include_terminating or not is_terminating(pod)


def target_port(pod: Obj, port: Obj) -> int | None:
    """The pod's port for one Service port, or None when the pod has no such named port."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    protocol = port.get("protocol") or "TCP"
    for container in spec_of(pod).get("containers") or []:
        for declared in container.get("ports") or []:
            if declared.get("name") == target and (declared.get("protocol") or "TCP") == protocol:
                return int(declared["containerPort"])
    return None


def endpoint_port(port: Obj, number: int) -> dict[str, Any]:
    """One resolved port as endpoints carry it: name, number, protocol, appProtocol."""
    out: dict[str, Any] = {
        "name": str(port.get("name") or ""),
        "port": number,
        "protocol": str(port.get("protocol") or "TCP"),
    }
    if port.get("appProtocol"):
        out["appProtocol"] = str(port["appProtocol"])
    return out


def resolved_ports(service: Obj, pod: Obj) -> list[dict[str, Any]]:
    """Every Service port the pod has, resolved for it."""
    out = []
    for port in service_ports(service):
        number = target_port(pod, port)
        if number is not None:
            out.append(endpoint_port(port, number))
    return out


def hostname_for(service: Obj, pod: Obj) -> str | None:
    """The pod's hostname when its subdomain is this Service (kube's ShouldSetHostname)."""
    spec = spec_of(pod)
    hostname, subdomain = spec.get("hostname"), spec.get("subdomain")
    if hostname and subdomain == meta_of(service).get("name"):
        return str(hostname)
    return None


def pod_identity(service: Obj, pod: Obj) -> dict[str, Any]:
    """What an endpoint says of its pod: hostname (if any), node and a reference to it."""
    out: dict[str, Any] = {}
    if hostname := hostname_for(service, pod):
        out["hostname"] = hostname
    if node := spec_of(pod).get("nodeName"):
        out["nodeName"] = str(node)
    out["targetRef"] = target_ref(pod)
    return out


def target_ref(pod: Obj) -> dict[str, str]:
    meta = meta_of(pod)
    ref = {"kind": "Pod", "namespace": str(meta.get("namespace")), "name": str(meta.get("name"))}
    if meta.get("uid"):
        ref["uid"] = str(meta["uid"])
    return ref


PortsKey = tuple[tuple[str, str, int, str], ...]  # (name, protocol, port, appProtocol)


def ports_key(ports: Iterable[Mapping[str, Any]]) -> PortsKey:
    """A canonical, hashable form of a set of ports, to group endpoints by."""
    return tuple(
        sorted((p["name"], p["protocol"], p["port"], p.get("appProtocol") or "") for p in ports)
    )


def ports_of(key: PortsKey) -> list[dict[str, Any]]:
    """The ports of a ``ports_key``, as endpoints carry them."""
    return [
        {"name": name, "port": port, "protocol": protocol} | ({"appProtocol": app} if app else {})
        for name, protocol, port, app in key
    ]


# --- Endpoints ---------------------------------------------------------------------------


def _address(service: Obj, pod: Obj, ip: str) -> dict[str, Any]:
    return {"ip": ip, **pod_identity(service, pod)}


def desired_subsets(service: Obj, pods: Iterable[Obj]) -> tuple[list[dict[str, Any]], bool]:
    """The Endpoints' subsets for ``service`` and the pods its selector matches, and
    whether they were cut to ``MAX_ENDPOINTS_ADDRESSES``."""
    tolerate = publishes_not_ready(service)
    primary = address_types(service)[0]
    ports_without = not service_ports(service)
    # ports -> (ready, not ready) addresses by (IP, pod): host-network pods share an IP
    groups: dict[PortsKey, tuple[dict[Any, Obj], dict[Any, Obj]]] = {}
    for pod in pods:
        if not selects(service, pod) or not pod_counts(pod, tolerate):
            continue
        ports = resolved_ports(service, pod)
        if not ports and not (ports_without and is_headless(service)):
            continue
        ready = tolerate or is_ready(pod)
        group = groups.setdefault(ports_key(ports), ({}, {}))
        # v1 Endpoints carry one IP a pod: the first of the Service's primary family
        for ip in [ip for ip in pod_ips(pod) if family(ip) == primary][:1]:
            group[0 if ready else 1][ip, meta_of(pod).get("name")] = _address(service, pod, ip)
    return _cap(
        [
            _subset(ports_of(key), ready, not_ready)
            for key, (ready, not_ready) in sorted(groups.items())
        ]
    )


def _subset(
    ports: list[dict[str, Any]], ready: dict[Any, Obj], not_ready: dict[Any, Obj]
) -> dict[str, Any]:
    subset: dict[str, Any] = {}
    if ready:
        subset["addresses"] = [ready[k] for k in sorted(ready)]
    if not_ready:
        subset["notReadyAddresses"] = [not_ready[k] for k in sorted(not_ready)]
    if ports:
        subset["ports"] = ports
    return subset


def _cap(subsets: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """At most ``MAX_ENDPOINTS_ADDRESSES`` addresses, ready ones kept first."""
    total = sum(len(s.get(f) or []) for s in subsets for f in ("addresses", "notReadyAddresses"))
    if total <= MAX_ENDPOINTS_ADDRESSES:
        return subsets, False
    room = MAX_ENDPOINTS_ADDRESSES
    for field in ("addresses", "notReadyAddresses"):
        for subset in subsets:
            kept = (subset.get(field) or [])[:room]
            room -= len(kept)
            if kept:
                subset[field] = kept
            else:
                subset.pop(field, None)
    return [s for s in subsets if s.get("addresses") or s.get("notReadyAddresses")], True


def desired_endpoints(service: Obj, pods: Iterable[Obj]) -> dict[str, Any]:
    """The whole Endpoints object the controller keeps for ``service``."""
    meta = meta_of(service)
    subsets, truncated = desired_subsets(service, pods)
    metadata: dict[str, Any] = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "labels": owned_labels(service, {ENDPOINTS_MANAGED_BY: ENDPOINTS_CONTROLLER}),
    }
    if truncated:
        metadata["annotations"] = {OVER_CAPACITY: "truncated"}
    endpoints = {"apiVersion": "v1", "kind": "Endpoints", "metadata": metadata}
    return {**endpoints, "subsets": subsets} if subsets else endpoints


def endpoints_differ(current: Obj, desired: Obj) -> bool:
    """Whether the stored Endpoints differ from the desired in what the controller owns."""
    cur, want = meta_of(current), meta_of(desired)
    over = (cur.get("annotations") or {}).get(OVER_CAPACITY)
    return (
        (current.get("subsets") or []) != (desired.get("subsets") or [])
        or (cur.get("labels") or {}) != want.get("labels")
        or over != (want.get("annotations") or {}).get(OVER_CAPACITY)
    )


def is_managed_endpoints(endpoints: Obj) -> bool:
    """Whether the controller wrote these Endpoints (and may delete them)."""
    return labels_of(endpoints).get(ENDPOINTS_MANAGED_BY) == ENDPOINTS_CONTROLLER
