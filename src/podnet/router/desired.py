"""The router's desired state, computed (pure) from admitted Routes, Services and slices.

``router_table(routes, services, endpoints)`` turns the admitted Routes into the
``RouterTable`` the HAProxy layer renders, as OpenShift's router does:

- the route's services are ``spec.to`` and ``spec.alternateBackends`` (Services only);
  a service that does not exist contributes no servers, so a route whose services are
  all missing is still served, by a backend without servers (503);
- a service's servers are its ready endpoints' ports; ``spec.port.targetPort`` keeps
  only the ports whose name, or number, equals it (OpenShift's ``PreferPort``);
- each service's weight (default 100) is shared equally among its servers, and the
  shares are scaled so the largest is 256 (HAProxy's maximum), each at least 1 unless
  its service's weight is 0: a 3:1 split over one endpoint each is 256:85;
- the host is lower case; the route's certificate, key and CA chain are concatenated
  into one PEM (what HAProxy loads), passthrough has no path and no certificate;
- ``service`` is ``spec.to``'s name: a re-encrypt route's pod certificate must name
  ``<service>.<namespace>.svc``, as OpenShift checks it.

``ServiceEndpoints`` is the ready (IP, port, port name) list of one Service, gathered
from its EndpointSlices (``slice_endpoints``, ``merge_endpoints``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from podnet.router.table import InsecurePolicy, RouteBackend, RouterTable, Server, Termination

Obj = Mapping[str, Any]
ServiceKey = tuple[str, str]  # (namespace, name)

MAX_WEIGHT = 256  # HAProxy's largest server weight
DEFAULT_WEIGHT = 100  # a route target's weight when it gives none (OpenShift's default)
DISABLE_COOKIES = "haproxy.router.openshift.io/disable_cookies"
TERMINATIONS = ("edge", "reencrypt", "passthrough")
INSECURE_POLICIES = ("None", "Allow", "Redirect")


@dataclass(frozen=True, order=True)
class EndpointPort:
    """One ready endpoint address with one of its ports."""

    ip: str
    port: int
    port_name: str = ""


ServiceEndpoints = tuple[EndpointPort, ...]


def slice_endpoints(endpoint_slice: Obj) -> list[EndpointPort]:
    """The ready (address, TCP port) pairs of one EndpointSlice (IPv4 and IPv6 slices;
    an endpoint whose ``ready`` condition is unset counts as ready, as Kubernetes says)."""
    if endpoint_slice.get("addressType") not in ("IPv4", "IPv6"):
        return []
    ports = [
        (str(p.get("name") or ""), int(p["port"]))
        for p in endpoint_slice.get("ports") or ()
        if p.get("port") and (p.get("protocol") or "TCP") == "TCP"
    ]
    found: list[EndpointPort] = []
    for endpoint in endpoint_slice.get("endpoints") or ():
        if (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        for address in endpoint.get("addresses") or ():
            found.extend(EndpointPort(str(address), port, name) for name, port in ports)
    return found


def merge_endpoints(groups: Iterable[Iterable[EndpointPort]]) -> ServiceEndpoints:
    """One Service's endpoint ports over all its slices, without repeats, sorted."""
    return tuple(sorted({e for group in groups for e in group}))


def router_table(
    routes: Iterable[Obj],
    services: Mapping[ServiceKey, Obj],
    endpoints: Mapping[ServiceKey, ServiceEndpoints],
) -> RouterTable:
    """The table of the admitted ``routes``: ``services`` and ``endpoints`` by
    (namespace, name); a route without a host is left out (it cannot be served)."""
    found = []
    for route in routes:
        backend = route_backend(route, services, endpoints)
        if backend is not None:
            found.append(backend)
    return RouterTable(tuple(found))


def route_backend(
    route: Obj,
    services: Mapping[ServiceKey, Obj],
    endpoints: Mapping[ServiceKey, ServiceEndpoints],
) -> RouteBackend | None:
    """One admitted route as the table holds it (None without a host)."""
    meta, spec = route.get("metadata") or {}, route.get("spec") or {}
    host = str(spec.get("host") or "").lower().rstrip(".")
    if not host:
        return None
    namespace = str(meta.get("namespace") or "")
    tls = spec.get("tls") or {}
    termination = _termination(tls)
    return RouteBackend(
        namespace=namespace,
        name=str(meta.get("name") or ""),
        host=host,
        path="" if termination == "passthrough" else str(spec.get("path") or ""),
        termination=termination,
        insecure=_insecure(tls, termination),
        servers=route_servers(namespace, spec, services, endpoints),
        certificate_pem=certificate_pem(tls) if termination in ("edge", "reencrypt") else None,
        destination_ca_pem=_pem(tls.get("destinationCACertificate"))
        if termination == "reencrypt"
        else None,
        sticky=(meta.get("annotations") or {}).get(DISABLE_COOKIES) != "true",
        service=str((spec.get("to") or {}).get("name") or ""),
    )


def route_servers(
    namespace: str,
    spec: Obj,
    services: Mapping[ServiceKey, Obj],
    endpoints: Mapping[ServiceKey, ServiceEndpoints],
) -> tuple[Server, ...]:
    """The servers of a route's services, weighted (module docstring)."""
    target_port = _target_port(spec)
    shares: list[tuple[float, list[EndpointPort]]] = []
    for name, weight in route_services(spec):
        key = (namespace, name)
        if key not in services:
            continue
        chosen = [e for e in endpoints.get(key, ()) if _port_matches(e, target_port)]
        if chosen:
            shares.append((weight / len(chosen), chosen))
    largest = max((share for share, _ in shares), default=0.0)
    weights: dict[tuple[str, int], int] = {}
    for share, chosen in shares:
        weight = scaled_weight(share, largest)
        for endpoint in chosen:  # one server per address: two services may share a pod
            address = (endpoint.ip, endpoint.port)
            weights[address] = min(MAX_WEIGHT, weights.get(address, 0) + weight)
    return tuple(sorted(Server(ip, port, w) for (ip, port), w in weights.items()))


def scaled_weight(share: float, largest: float) -> int:
    """A server's HAProxy weight: its share of its service's weight, scaled so that the
    largest share is 256; never 0 for a share above 0."""
    if share <= 0 or largest <= 0:
        return 0
    return max(1, min(MAX_WEIGHT, int(share * MAX_WEIGHT / largest)))


def route_services(spec: Obj) -> list[tuple[str, int]]:
    """(service name, weight) of ``spec.to`` and each of ``spec.alternateBackends`` that
    names a Service (the first of a name counts)."""
    found: dict[str, int] = {}
    for target in (spec.get("to") or {}, *(spec.get("alternateBackends") or ())):
        name = str(target.get("name") or "")
        if not name or (target.get("kind") or "Service") != "Service" or name in found:
            continue
        weight = target.get("weight")
        found[name] = DEFAULT_WEIGHT if weight is None else max(0, int(weight))
    return list(found.items())


def certificate_pem(tls: Obj) -> str | None:
    """The route's certificate, key and CA certificate as one PEM (None without a
    certificate: the default certificate serves the host)."""
    if not tls.get("certificate"):
        return None
    parts = (_pem(tls.get(field)) for field in ("certificate", "key", "caCertificate"))
    return "".join(part for part in parts if part)


def _pem(text: object) -> str | None:
    """PEM text ending in one newline, or None when empty."""
    stripped = str(text or "").strip()
    return stripped + "\n" if stripped else None


def _termination(tls: Obj) -> Termination:
    termination = str(tls.get("termination") or "").lower()
    return cast("Termination", termination) if termination in TERMINATIONS else "http"


def _insecure(tls: Obj, termination: Termination) -> InsecurePolicy:
    if termination == "http":
        return "None"
    policy = str(tls.get("insecureEdgeTerminationPolicy") or "None")
    return cast("InsecurePolicy", policy) if policy in INSECURE_POLICIES else "None"


def _target_port(spec: Obj) -> str:
    """``spec.port.targetPort`` as text ("" when the route names none)."""
    value = (spec.get("port") or {}).get("targetPort")
    return "" if value is None else str(value)


def _port_matches(endpoint: EndpointPort, target_port: str) -> bool:
    return not target_port or target_port in (endpoint.port_name, str(endpoint.port))
