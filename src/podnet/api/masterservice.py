"""The ``default/kubernetes`` Service and its endpoints, as kube-apiserver keeps them
(pure: desired objects and what differs, no I/O).

- The Service: type ClusterIP, the service network's first host address as its cluster
  IP (``podnet.api.servicealloc.kubernetes_service_ip``; no other Service may ask for
  it), one port ``https`` 443/TCP to the masters' port, no selector.
- Its Endpoints and EndpointSlice, both named ``kubernetes``, hold the addresses the live
  masters advertise (``--advertise-address``), all on one port; no addresses when no
  master advertises one. The Endpoints carry ``endpointslice.kubernetes.io/skip-mirror``
  and the slice ``managed-by: podnet-master``, so the endpoints controllers leave both
  alone (the masters write them, as kube-apiserver's endpoint reconciler does).

``service_fix`` says whether a live Service is right, needs an update (a changed port,
type or selector: repaired like kube-apiserver's bootstrap controller does), or must be
deleted and made again (another cluster IP: immutable).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from podnet.model.errors import FieldError
from podnet.model.schemas_discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from podnet.model.schemas_names import quote

Obj = dict[str, Any]
NAMESPACE = "default"
NAME = "kubernetes"
PORT_NAME = "https"
SERVICE_PORT = 443
MANAGER = "podnet-master"
SKIP_MIRROR_LABEL = "endpointslice.kubernetes.io/skip-mirror"
SERVICE_LABELS = {"component": "apiserver", "provider": "kubernetes"}
Fix = Literal["none", "update", "recreate"]


def is_master_service(namespace: str | None, name: str | None) -> bool:
    return namespace == NAMESPACE and name == NAME


def reserved_ip_problems(
    obj: Mapping[str, Any], old_spec: Mapping[str, Any] | None, reserved: str
) -> list[FieldError]:
    """A Service other than ``default/kubernetes`` asking for the reserved cluster IP."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ip = spec.get("clusterIP")
    if is_master_service(meta.get("namespace"), meta.get("name")) or not ip:
        return []
    if ip == (old_spec or {}).get("clusterIP") or ip != reserved:
        return []
    why = f"Invalid value: {quote(ip)}: reserved for the Service {NAMESPACE}/{NAME}"
    return [FieldError("spec.clusterIP", why)]


def _port(target_port: int) -> Obj:
    return {"name": PORT_NAME, "protocol": "TCP", "port": SERVICE_PORT, "targetPort": target_port}


def desired_service(cluster_ip: str, target_port: int) -> Obj:
    """The ``kubernetes`` Service as the masters create it."""
    family = f"IPv{ipaddress.ip_address(cluster_ip).version}"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(SERVICE_LABELS)},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "ipFamilies": [family],
            "ports": [_port(target_port)],
            "sessionAffinity": "None",
        },
    }


def _ports_of(spec: Mapping[str, Any]) -> list[Obj]:
    keys = ("name", "protocol", "port", "targetPort")
    return [{k: p.get(k) for k in keys} for p in spec.get("ports") or []]


def service_fix(live: Mapping[str, Any], desired: Mapping[str, Any]) -> Fix:
    """What the live Service needs to be ``desired`` again."""
    spec, want = live.get("spec") or {}, desired["spec"]
    if spec.get("clusterIP") != want["clusterIP"]:
        return "recreate"
    if (
        spec.get("type") != want["type"]
        or spec.get("selector")
        or _ports_of(spec) != _ports_of(want)
    ):
        return "update"
    return "none"


def repaired_service(live: Mapping[str, Any], desired: Mapping[str, Any]) -> Obj:
    """``live`` with the fields the masters own set back (its resourceVersion kept)."""
    spec = {k: v for k, v in (live.get("spec") or {}).items() if k != "selector"}
    spec.update(type="ClusterIP", ports=[dict(p) for p in desired["spec"]["ports"]])
    for field in ("externalIPs", "externalName", "loadBalancerIP", "externalTrafficPolicy"):
        spec.pop(field, None)
    return {**live, "spec": spec}


def advertised(addresses: Iterable[str]) -> list[str]:
    """The masters' addresses, unique and in address order."""
    unique = {ipaddress.ip_address(a) for a in addresses}
    return [str(a) for a in sorted(unique, key=lambda a: (a.version, int(a)))]


def desired_endpoints(addresses: Iterable[str], port: int) -> Obj:
    """The Endpoints of the ``kubernetes`` Service: one subset, or none without masters."""
    found = advertised(addresses)
    subsets = []
    if found:
        ports = [{"name": PORT_NAME, "port": port, "protocol": "TCP"}]
        subsets = [{"addresses": [{"ip": ip} for ip in found], "ports": ports}]
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {SKIP_MIRROR_LABEL: "true"}},
        "subsets": subsets,
    }


def desired_slice(addresses: Iterable[str], port: int, family: str = "IPv4") -> Obj:
    """The EndpointSlice of the ``kubernetes`` Service (no endpoints without masters)."""
    found = [a for a in advertised(addresses) if f"IPv{ipaddress.ip_address(a).version}" == family]
    conditions = {"ready": True, "serving": True, "terminating": False}
    labels = {SERVICE_NAME_LABEL: NAME, MANAGED_BY_LABEL: MANAGER}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
        "addressType": family,
        "endpoints": [{"addresses": [ip], "conditions": dict(conditions)} for ip in found],
        "ports": [{"name": PORT_NAME, "port": port, "protocol": "TCP"}],
    }


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _labels_hold(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    have = _labels(live)
    return all(have.get(k) == v for k, v in _labels(desired).items())


def endpoints_fix(live: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> Obj | None:
    """What to write so the live Endpoints are ``desired`` (None: they are)."""
    if live is None:
        return dict(desired)
    if _labels_hold(live, desired) and (live.get("subsets") or []) == desired["subsets"]:
        return None
    return _over(live, desired, ("subsets",))


def slice_fix(live: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> Obj | None:
    """What to write so the live EndpointSlice is ``desired`` (None: it is)."""
    if live is None:
        return dict(desired)
    same = (
        all((live.get(k) or []) == desired[k] for k in ("endpoints", "ports"))
        and live.get("addressType") == desired["addressType"]
    )
    if same and _labels_hold(live, desired):
        return None
    return _over(live, desired, ("addressType", "endpoints", "ports"))


def _over(live: Mapping[str, Any], desired: Mapping[str, Any], fields: Iterable[str]) -> Obj:
    meta = dict(live.get("metadata") or {})
    meta["labels"] = {**_labels(live), **_labels(desired)}
    return {**live, "metadata": meta, **{k: desired[k] for k in fields}}


SERVICE_NAMES = (
    NAME,
    f"{NAME}.{NAMESPACE}",
    f"{NAME}.{NAMESPACE}.svc",
    f"{NAME}.{NAMESPACE}.svc.cluster.local",
)  # the masters' serving certificate carries them, as kube-apiserver's does
