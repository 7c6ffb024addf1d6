"""Table cells of Endpoints and EndpointSlices, as ``kubectl get ep,endpointslices`` prints.

Kubernetes' printers show at most three entries and then ``+ N more...``: for Endpoints
``ip:port`` pairs (ports outer, addresses inner, IPv6 in brackets), for an EndpointSlice
its port numbers and its addresses, ``<unset>`` when there are none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = Mapping[str, Any]
SHOWN = 3


def _listed(entries: list[str], total: int, empty: str) -> str:
    shown = ",".join(entries[:SHOWN])
    if total > SHOWN:
        return f"{shown} + {total - SHOWN} more..."
    return shown or empty


def host_port(ip: str, port: object) -> str:
    """``ip:port``, with an IPv6 address in brackets (Go's net.JoinHostPort)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _mappings(value: object) -> list[Obj]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def endpoints_cell(obj: Obj) -> str:
    """The ENDPOINTS column of an Endpoints object: ready addresses with their ports."""
    subsets = _mappings(obj.get("subsets"))
    if not subsets:
        return "<none>"
    entries: list[str] = []
    for subset in subsets:
        ips = [str(a.get("ip")) for a in _mappings(subset.get("addresses"))]
        ports = _mappings(subset.get("ports"))
        if not ports:  # a headless service may have no ports
            entries += ips
        for port in ports:
            entries += [host_port(ip, port.get("port")) for ip in ips]
    return _listed(entries, len(entries), "")


def _port_number(port: Obj) -> str:
    number = port.get("port")
    return str(number) if number is not None else str(port.get("name") or "*")


def slice_ports_cell(obj: Obj) -> str:
    """The PORTS column of an EndpointSlice: numbers (a name, or ``*``, when unset)."""
    entries = [_port_number(p) for p in _mappings(obj.get("ports"))]
    return _listed(entries, len(entries), "<unset>")


def slice_endpoints_cell(obj: Obj) -> str:
    """The ENDPOINTS column of an EndpointSlice: every address of every endpoint."""
    entries = [
        str(address)
        for endpoint in _mappings(obj.get("endpoints"))
        for address in endpoint.get("addresses") or []
    ]
    return _listed(entries, len(entries), "<unset>")
