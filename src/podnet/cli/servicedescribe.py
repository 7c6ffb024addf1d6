"""``podnet describe`` views of Services, Endpoints and EndpointSlices, laid out as
``kubectl describe`` lays them out (pure functions of the objects).

A Service shows its selector, type, cluster IPs, and per port its target port, node port
and the endpoints that serve it (read from the Endpoints of the same name: at most three
``ip:port`` entries, then ``+ N more...``), then session affinity and traffic policies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from podnet.cli.output import NONE, cell, describe, format_table
from podnet.client import StatusError
from podnet.model.endpointcells import host_port
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS, ROUTE, SERVICE, Kind
from podnet.model.routecells import redacted_route

Obj = Mapping[str, Any]
Row = tuple[str, str]
SHOWN = 3
UNSET = "<unset>"


def _maps(value: object) -> list[Obj]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _labels(value: object, sep: str) -> str:
    if not isinstance(value, Mapping) or not value:
        return NONE
    return ",".join(f"{k}{sep}{v}" for k, v in sorted(value.items()))


def aligned(rows: Sequence[Row], indent: str = "") -> list[str]:
    """``Label:  value`` lines, values aligned two spaces after the longest label."""
    width = max((len(label) for label, _ in rows), default=0) + 3
    return [f"{indent}{label + ':':<{width}}{value}".rstrip() for label, value in rows]


def _identity(obj: Obj) -> list[Row]:
    meta = obj.get("metadata") or {}
    rows = [("Name", cell(meta.get("name"))), ("Namespace", cell(meta.get("namespace")))]
    rows.append(("Labels", _labels(meta.get("labels"), "=")))
    rows.append(("Annotations", _labels(meta.get("annotations"), ": ")))
    return rows


def _listed(entries: list[str]) -> str:
    shown = ",".join(entries[:SHOWN])
    more = len(entries) - SHOWN
    return f"{shown} + {more} more..." if more > 0 else (shown or NONE)


def port_endpoints(endpoints: Obj | None, port_name: str) -> str:
    """The ready ``ip:port`` entries of the Endpoints for the Service port ``port_name``."""
    entries: list[str] = []
    for subset in _maps((endpoints or {}).get("subsets")):
        ips = [str(a.get("ip")) for a in _maps(subset.get("addresses"))]
        for port in _maps(subset.get("ports")):
            if str(port.get("name") or "") == port_name:
                entries += [host_port(ip, port.get("port")) for ip in ips]
    return _listed(entries)


def _port_rows(spec: Obj, endpoints: Obj | None) -> list[Row]:
    rows: list[Row] = []
    with_node_port = spec.get("type") in ("NodePort", "LoadBalancer")
    for port in _maps(spec.get("ports")):
        name, proto = str(port.get("name") or ""), str(port.get("protocol") or "TCP")
        rows.append(("Port", f"{name or UNSET}  {port.get('port')}/{proto}"))
        target = port.get("targetPort", port.get("port"))
        rows.append(("TargetPort", f"{target}/{proto}"))
        if with_node_port and port.get("nodePort"):
            rows.append(("NodePort", f"{name or UNSET}  {port['nodePort']}/{proto}"))
        rows.append(("Endpoints", port_endpoints(endpoints, name)))
    return rows


def describe_service(service: Obj, endpoints: Obj | None) -> str:
    """``kubectl describe service``: ``endpoints`` is the Endpoints of the same name."""
    spec = service.get("spec") or {}
    kind = str(spec.get("type") or "ClusterIP")
    rows = _identity(service)
    rows.append(("Selector", _labels(spec.get("selector"), "=")))
    rows.append(("Type", kind))
    if kind == "ExternalName":
        rows.append(("External Name", cell(spec.get("externalName"))))
    else:
        rows.append(("IP", cell(spec.get("clusterIP"))))
        rows.append(("IPs", cell(spec.get("clusterIPs") or spec.get("clusterIP"))))
    if spec.get("externalIPs"):
        rows.append(("External IPs", cell(spec["externalIPs"])))
    rows += _port_rows(spec, endpoints)
    rows.append(("Session Affinity", cell(spec.get("sessionAffinity") or "None")))
    if kind in ("NodePort", "LoadBalancer"):
        rows.append(("External Traffic Policy", cell(spec.get("externalTrafficPolicy"))))
    if spec.get("internalTrafficPolicy"):
        rows.append(("Internal Traffic Policy", cell(spec["internalTrafficPolicy"])))
    rows.append(("Events", NONE))
    return "\n".join(aligned(rows))


def _ports_table(ports: list[Obj], indent: str) -> list[str]:
    if not ports:
        return [f"{indent}{NONE}"]
    headers = ["Name", "Port", "Protocol"]
    body = [
        [cell(p.get("name") or UNSET), cell(p.get("port")), cell(p.get("protocol") or "TCP")]
        for p in ports
    ]
    rules = [["-" * len(h) for h in headers]]
    return format_table(headers, rules + body, indent=indent).split("\n")


def describe_endpoints(endpoints: Obj) -> str:
    """``kubectl describe endpoints``: each subset's addresses and ports."""
    lines = aligned(_identity(endpoints))
    lines.append("Subsets:")
    for subset in _maps(endpoints.get("subsets")):
        ready = [str(a.get("ip")) for a in _maps(subset.get("addresses"))]
        waiting = [str(a.get("ip")) for a in _maps(subset.get("notReadyAddresses"))]
        rows = [("Addresses", ",".join(ready) or NONE)]
        rows.append(("NotReadyAddresses", ",".join(waiting) or NONE))
        lines += aligned(rows, "  ")
        lines.append("  Ports:")
        lines += _ports_table(_maps(subset.get("ports")), "    ")
        lines.append("")
    lines.append(f"Events:  {NONE}")
    return "\n".join(lines)


def _endpoint_lines(endpoint: Obj) -> list[str]:
    """One endpoint of a slice: ``  - Addresses: ...`` and its details below."""
    target = endpoint.get("targetRef") or {}
    ready = (endpoint.get("conditions") or {}).get("ready")
    rows = [("Addresses", ",".join(str(a) for a in endpoint.get("addresses") or []) or NONE)]
    rows.append(("Hostname", cell(endpoint.get("hostname") or UNSET)))
    rows.append(("TargetRef", f"{target.get('kind')}/{target.get('name')}" if target else UNSET))
    rows.append(("NodeName", cell(endpoint.get("nodeName") or UNSET)))
    rows.append(("Zone", cell(endpoint.get("zone") or UNSET)))
    lines = aligned(rows, "    ")
    condition = aligned([("Ready", cell(ready) if ready is not None else UNSET)], "      ")
    return ["  - " + lines[0][4:], "    Conditions:", *condition, *lines[1:]]


def describe_endpoint_slice(endpoint_slice: Obj) -> str:
    """``kubectl describe endpointslice``: address type, ports, each endpoint."""
    address_type = ("AddressType", cell(endpoint_slice.get("addressType")))
    lines = aligned([*_identity(endpoint_slice), address_type])
    lines.append("Ports:")
    lines += _ports_table(_maps(endpoint_slice.get("ports")), "  ")
    lines.append("Endpoints:")
    endpoints = _maps(endpoint_slice.get("endpoints"))
    for endpoint in endpoints:
        lines += _endpoint_lines(endpoint)
    if not endpoints:
        lines.append(f"  {NONE}")
    lines.append(f"Events:  {NONE}")
    return "\n".join(lines)


def _same(kind: Kind, other: Kind) -> bool:
    return (kind.group, kind.plural) == (other.group, other.plural)


def describe_view(client: Any, kind: Kind, obj: Obj) -> str:
    """The describe text of ``obj``; a Service's shows its Endpoints' addresses (read
    with ``client``), other kinds without a view here get ``output.describe``'s."""
    if _same(kind, SERVICE):
        meta = obj.get("metadata") or {}
        try:
            endpoints = client.get(ENDPOINTS, meta.get("namespace"), str(meta.get("name")))
        except StatusError as exc:
            if exc.code != 404:
                raise
            endpoints = None
        return describe_service(obj, endpoints)
    if _same(kind, ENDPOINTS):
        return describe_endpoints(obj)
    if _same(kind, ENDPOINT_SLICE):
        return describe_endpoint_slice(obj)
    if _same(kind, ROUTE):
        return describe(kind, redacted_route(obj))  # no TLS key on a terminal
    return describe(kind, obj)
