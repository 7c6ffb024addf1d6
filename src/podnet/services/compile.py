"""Services and EndpointSlices -> ``ServiceTable`` for one node (pure).

``ServiceCompiler`` holds the cluster's Services and EndpointSlices (``discovery.k8s.io/v1``,
tied to their service by the label ``kubernetes.io/service-name``) and recompiles only the
services whose objects changed: at 5,000 services an endpoint change costs one service's
compile, not the cluster's.

What counts, as kube-proxy reads it:

- a port gets an entry for its cluster IP (not for a headless service, nor an
  ExternalName one), its ``nodePort`` (types NodePort and LoadBalancer) and each of its
  ``externalIPs``;
- endpoints come from the slices' ports of the same name and protocol; an endpoint is
  used when ``conditions.ready`` is not false (absent means ready), with its first
  address; ``nodeName`` equal to this node's makes it local; one address and port is
  used once however many slices list it;
- ``sessionAffinity: ClientIP`` with ``sessionAffinityConfig.clientIP.timeoutSeconds``
  (3 hours by default); ``externalTrafficPolicy`` and ``internalTrafficPolicy`` ``Local``.

Malformed parts (an address that is not IPv4, a port out of range) are skipped, the rest
of the object is used: the API validates what it stores, so this is only a guard.

The compiler keeps no API object: a Service is kept as its ports compiled without
endpoints (``service_record``), an EndpointSlice as its ports and ready endpoints
(``slice_record``, ``SliceRecord``): at 5,000 services x 10 endpoints the full objects
cost ~45 MB, the records a fraction of it.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

from podnet.services.model import (
    DEFAULT_AFFINITY_SECONDS,
    PROTOCOLS,
    Endpoint,
    ServicePort,
    ServiceTable,
)

Obj = Mapping[str, Any]
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
WITH_NODE_PORTS = ("NodePort", "LoadBalancer")
SlicePort = tuple[str, str, int | None]  # (name, protocol in lower case, number)


@dataclass(frozen=True, slots=True)
class SliceRecord:
    """What the compile reads of one EndpointSlice: its service (``namespace/name``),
    its ports, and its ready endpoints' first addresses with whether they are local."""

    service: str
    ports: tuple[SlicePort, ...] = ()
    endpoints: tuple[tuple[IPv4Address, bool], ...] = ()


def object_key(obj: Obj) -> str:
    """``namespace/name`` of an object."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def slice_service(endpoint_slice: Obj) -> str | None:
    """``namespace/service`` that an EndpointSlice belongs to (None without the label)."""
    meta = endpoint_slice.get("metadata") or {}
    name = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
    return f"{meta.get('namespace') or ''}/{name}" if name else None


class ServiceCompiler:
    """The cluster's services and slices, compiled for node ``node_name``."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._services: dict[str, tuple[ServicePort, ...]] = {}  # see service_record
        self._slices: dict[str, SliceRecord] = {}  # slice key -> its record
        self._slices_of: dict[str, set[str]] = {}  # service key -> slice keys
        self._compiled: dict[str, tuple[ServicePort, ...]] = {}
        self._order: list[str] = []  # the keys of _compiled, sorted (see _place)
        self._dirty: set[str] = set()
        self._table: ServiceTable | None = None
        self._node_ips: tuple[IPv4Address, ...] = ()

    def set_node_ips(self, ips: Iterable[IPv4Address]) -> None:
        """Every node's address (HostSubnet ``hostIP``)."""
        found = tuple(sorted(set(ips)))
        if found != self._node_ips:
            self._node_ips, self._table = found, None

    def replace_services(self, services: Iterable[Obj]) -> None:
        """A full listing of Services."""
        old = set(self._services)
        self._services = {object_key(s): service_record(s) for s in services}
        self._dirty |= old | set(self._services)

    def replace_slices(self, slices: Iterable[Obj]) -> None:
        """A full listing of EndpointSlices."""
        for key in list(self._slices):
            self._remove_slice(key)
        for endpoint_slice in slices:
            self.put_slice(endpoint_slice)

    def put_service(self, service: Obj) -> None:
        key = object_key(service)
        self._services[key] = service_record(service)
        self._dirty.add(key)

    def remove_service(self, service: Obj) -> None:
        key = object_key(service)
        self._services.pop(key, None)
        self._dirty.add(key)

    def put_slice(self, endpoint_slice: Obj) -> None:
        key = object_key(endpoint_slice)
        self._remove_slice(key)
        record = slice_record(endpoint_slice, self.node_name)
        if record is None:
            return
        self._slices[key] = record
        self._slices_of.setdefault(record.service, set()).add(key)
        self._dirty.add(record.service)

    def remove_slice(self, endpoint_slice: Obj) -> None:
        self._remove_slice(object_key(endpoint_slice))

    def _remove_slice(self, key: str) -> None:
        old = self._slices.pop(key, None)
        if old is None:
            return
        owner = old.service
        keys = self._slices_of.get(owner, set())
        keys.discard(key)
        if not keys:
            self._slices_of.pop(owner, None)
        self._dirty.add(owner)

    def table(self) -> ServiceTable:
        """The node's table; the same object as last time when nothing changed."""
        if self._table is not None and not self._dirty:
            return self._table
        for key in self._dirty:
            templates = self._services.get(key, ())
            slices = [self._slices[k] for k in sorted(self._slices_of.get(key, ()))]
            ports = with_endpoints(templates, slices) if templates else ()
            self._place(key, tuple(sorted(ports, key=_port_key)))
        self._dirty.clear()
        every = itertools.chain.from_iterable(self._compiled[key] for key in self._order)
        self._table = ServiceTable(tuple(every), self._node_ips)
        return self._table

    def _place(self, key: str, ports: tuple[ServicePort, ...]) -> None:
        """Keep ``key``'s ports, and ``_order``: the services in the order of their ports'
        keys (``namespace/name/...``: by ``namespace/name/``), kept sorted by bisection."""
        known = key in self._compiled
        if ports:
            self._compiled[key] = ports
            if not known:
                bisect.insort(self._order, key, key=_order_key)
        elif known:
            del self._compiled[key]
            self._order.pop(bisect.bisect_left(self._order, _order_key(key), key=_order_key))


def _port_key(port: ServicePort) -> str:
    return port.key


def _order_key(service: str) -> str:
    return service + "/"


def compile_services(
    services: Iterable[Obj], slices: Iterable[Obj], node_name: str
) -> ServiceTable:
    """The table for ``node_name`` from full listings (what ``ServiceCompiler`` keeps)."""
    compiler = ServiceCompiler(node_name)
    compiler.replace_services(services)
    compiler.replace_slices(slices)
    return compiler.table()


def service_record(service: Obj) -> tuple[ServicePort, ...]:
    """A Service's ports as the table has them, without endpoints (none for
    ExternalName, nor for a port with neither cluster IP, node port nor external IP)."""
    meta, spec = service.get("metadata") or {}, service.get("spec") or {}
    if spec.get("type") == "ExternalName":
        return ()
    cluster_ip = _ipv4(spec.get("clusterIP"))
    node_ports = spec.get("type") in WITH_NODE_PORTS
    external_ips = tuple(sorted({ip for ip in map(_ipv4, spec.get("externalIPs") or ()) if ip}))
    found = []
    for port in spec.get("ports") or ():
        protocol = str(port.get("protocol") or "TCP").lower()
        number = _port(port.get("port"))
        if protocol not in PROTOCOLS or number is None:
            continue
        found.append(
            ServicePort(
                namespace=str(meta.get("namespace") or ""),
                name=str(meta.get("name") or ""),
                port_name=str(port.get("name") or ""),
                protocol=protocol,
                port=number,
                cluster_ip=cluster_ip,
                node_port=_port(port.get("nodePort")) if node_ports else None,
                external_ips=external_ips,
                affinity_seconds=affinity_seconds(spec),
                external_local=spec.get("externalTrafficPolicy") == "Local",
                internal_local=spec.get("internalTrafficPolicy") == "Local",
            )
        )
    return tuple(p for p in found if p.cluster_ip or p.node_port or p.external_ips)


def slice_record(endpoint_slice: Obj, node_name: str) -> SliceRecord | None:
    """What the compile for ``node_name`` reads of an EndpointSlice (None without the
    service label; no ports nor endpoints for a slice that is not IPv4)."""
    owner = slice_service(endpoint_slice)
    if owner is None:
        return None
    if endpoint_slice.get("addressType", "IPv4") != "IPv4":
        return SliceRecord(owner)
    ports: list[SlicePort] = []
    for port in endpoint_slice.get("ports") or ():
        protocol = str(port.get("protocol") or "TCP").lower()
        ports.append((str(port.get("name") or ""), protocol, _port(port.get("port"))))
    endpoints: list[tuple[IPv4Address, bool]] = []
    for endpoint in endpoint_slice.get("endpoints") or ():
        if (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        ip = _ipv4((endpoint.get("addresses") or [None])[0])
        if ip is not None:
            endpoints.append((ip, endpoint.get("nodeName") == node_name))
    return SliceRecord(owner, tuple(ports), tuple(endpoints))


def with_endpoints(
    templates: tuple[ServicePort, ...], slices: list[SliceRecord]
) -> tuple[ServicePort, ...]:
    """A service's ports (``service_record``) with their endpoints from its slices."""
    return tuple(
        dataclasses.replace(p, endpoints=endpoints_for(slices, p.port_name, p.protocol))
        for p in templates
    )


def endpoints_for(slices: list[SliceRecord], port_name: str, protocol: str) -> tuple[Endpoint, ...]:
    """The ready endpoints of the slices' port named ``port_name`` (and ``protocol``),
    sorted, one per address and port (local wins when two slices disagree). Sorted by
    the address's number, not by comparing ``Endpoint``s: 50,000 of them at a restart."""
    found: list[tuple[int, int, bool, IPv4Address]] = []
    for record in slices:
        number = _slice_port(record, port_name, protocol)
        if number is not None:
            found.extend((int(ip), number, local, ip) for ip, local in record.endpoints)
    found.sort(key=lambda item: item[:3])
    best: dict[tuple[int, int], Endpoint] = {}
    for value, number, local, ip in found:
        best[(value, number)] = Endpoint(ip, number, local)
    return tuple(best.values())


def affinity_seconds(spec: Obj) -> int | None:
    """The ClientIP affinity timeout, or None without affinity."""
    if spec.get("sessionAffinity") != "ClientIP":
        return None
    config = (spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}
    seconds = config.get("timeoutSeconds")
    return seconds if isinstance(seconds, int) and seconds > 0 else DEFAULT_AFFINITY_SECONDS


def _slice_port(record: SliceRecord, port_name: str, protocol: str) -> int | None:
    """The first port of the slice with that name and protocol (as kube-proxy: the
    first match, even when its number is malformed)."""
    for name, proto, number in record.ports:
        if name == port_name and proto == protocol:
            return number
    return None


def _ipv4(value: object) -> IPv4Address | None:
    """The address, or None. The C parser first (a quarter of ``IPv4Address``'s time;
    it takes dotted quads only, as ``IPv4Address`` does), that one for the rest."""
    if isinstance(value, str):
        try:
            return IPv4Address(socket.inet_pton(socket.AF_INET, value))
        except OSError:
            pass
    try:
        return IPv4Address(str(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _port(value: object) -> int | None:
    return value if type(value) is int and 0 < value < 65536 else None
