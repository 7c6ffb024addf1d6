"""The records Kubernetes objects stand for in the cluster zone (pure functions).

Kubernetes DNS-based service discovery, schema 1.1.0, for zone ``<zone>``:

- a Service with a cluster IP: ``<svc>.<ns>.svc.<zone>`` A (AAAA for an IPv6 one), a PTR
  from each cluster IP, and per *named* port ``_<port>._<proto>.<svc>.<ns>.svc.<zone>``
  SRV -> the service name;
- a headless Service (``clusterIP: None``): per *ready* endpoint address an A record at the
  service name and at ``<hostname>.<svc>.<ns>.svc.<zone>`` (the endpoint's ``hostname``,
  else its dashed address), a PTR from the address to that name, and endpoints x named
  ports SRV records targeting it (the EndpointSlice's ports: clients connect straight to
  the endpoints);
- an ExternalName Service: a CNAME to ``spec.externalName``;
- a pod (CoreDNS's ``pods verified``): ``a-b-c-d.<ns>.pod.<zone>`` A;
- the zone: its SOA and NS at the apex, ``dns-version.<zone>`` TXT ``"1.1.0"``.

Objects are first slimmed to what the records need (``ServiceInfo``, ``SliceInfo``,
``PodInfo``); names that are not valid DNS names give no records rather than an error.
"""

from __future__ import annotations

import ipaddress
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from podnet.dns.names import MAX_NAME, dashed, is_domain_name, is_label, normalize, reverse_name

A, NS, CNAME, SOA, PTR, TXT, AAAA, SRV = 1, 2, 5, 6, 12, 16, 28, 33
SCHEMA_VERSION = "1.1.0"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
TOLERATE_UNREADY = "service.alpha.kubernetes.io/tolerate-unready-endpoints"
SOA_TIMERS = (7200, 1800, 86400)  # refresh, retry, expire (CoreDNS's values)

Obj = Mapping[str, Any]
Key = tuple[str, str]  # (namespace, name)
RData = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Record:
    """One resource record without TTL or class: owner name (normalized), type, data.
    ``data`` is (address,) for A/AAAA, (target,) for CNAME/PTR/NS, (text,) for TXT,
    (priority, weight, port, target) for SRV, (mname, rname, serial, refresh, retry,
    expire, minimum) for SOA."""

    name: str
    rtype: int
    data: RData


class ServicePort(NamedTuple):
    """A named port: its name and protocol in lower case, and its number."""

    name: str
    protocol: str
    port: int


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """What the records of a Service depend on."""

    namespace: str
    name: str
    cluster_ips: tuple[str, ...] = ()
    headless: bool = False
    external_name: str | None = None
    ports: tuple[ServicePort, ...] = ()
    publish_not_ready: bool = False

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint of a slice: its addresses, hostname (None: none given), readiness."""

    addresses: tuple[str, ...]
    hostname: str | None
    ready: bool


@dataclass(frozen=True, slots=True)
class SliceInfo:
    """What the records of a headless Service need from one of its EndpointSlices. The
    endpoints are kept packed in one string (``pack_endpoints``): every slice is kept,
    also those of services with a cluster IP, whose records never read them; at 50,000
    endpoints one string per slice costs ~2 MB where the objects cost ~15 MB."""

    namespace: str
    name: str
    service: str
    packed: str = ""
    ports: tuple[ServicePort, ...] = ()

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return unpack_endpoints(self.packed)

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def service_key(self) -> Key:
        return (self.namespace, self.service)


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A running pod's namespace, name and addresses."""

    namespace: str
    name: str
    addresses: tuple[str, ...] = ()

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


# ---- slimming ----------------------------------------------------------------------------


def object_key(obj: Obj) -> Key:
    """(namespace, name) of any object. Namespaces are interned: a few strings shared by
    every key, instead of one per object (50,000 pods: ~2.5 MB)."""
    meta = obj.get("metadata") or {}
    return (sys.intern(str(meta.get("namespace") or "")), str(meta.get("name") or ""))


def _address(value: object) -> str | None:
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        return None


def _named_ports(ports: object) -> tuple[ServicePort, ...]:
    found = []
    for port in ports if isinstance(ports, list) else ():
        if not isinstance(port, Mapping):
            continue
        name = sys.intern(str(port.get("name") or "").lower())  # a few shared strings
        protocol = sys.intern(str(port.get("protocol") or "TCP").lower())
        number = port.get("port")
        if is_label(name) and is_label(protocol) and type(number) is int and 0 < number < 65536:
            found.append(ServicePort(name, protocol, number))
    return tuple(found)


def service_info(obj: Obj) -> ServiceInfo | None:
    """The slim form of a Service, or None when its names cannot be DNS names."""
    namespace, name = object_key(obj)
    if not (is_label(namespace) and is_label(name)):
        return None
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    if spec.get("type") == "ExternalName":
        target = normalize(str(spec.get("externalName") or ""))
        return ServiceInfo(namespace, name, external_name=target if is_domain_name(target) else "")
    raw = spec.get("clusterIPs") or [spec.get("clusterIP")]
    headless = spec.get("clusterIP") == "None" or raw == ["None"]
    ips = () if headless else tuple(ip for ip in map(_address, raw) if ip is not None)
    tolerate = (meta.get("annotations") or {}).get(TOLERATE_UNREADY) == "true"
    return ServiceInfo(
        namespace,
        name,
        cluster_ips=ips,
        headless=headless,
        ports=_named_ports(spec.get("ports")),
        publish_not_ready=bool(spec.get("publishNotReadyAddresses")) or tolerate,
    )


def _endpoint(entry: object) -> Endpoint | None:
    if not isinstance(entry, Mapping):
        return None
    raw = entry.get("addresses")
    addresses = tuple(ip for ip in map(_address, raw if isinstance(raw, list) else ()) if ip)
    hostname = str(entry.get("hostname") or "").lower() or None
    if hostname is not None and not is_label(hostname):
        hostname = None
    conditions = entry.get("conditions") or {}
    ready = conditions.get("ready") is not False  # unset means ready (the API's rule)
    return Endpoint(addresses, hostname, ready) if addresses else None


def slice_info(obj: Obj) -> SliceInfo | None:
    """The slim form of an EndpointSlice, or None when it names no service (or an FQDN
    slice, which has no addresses to publish)."""
    namespace, name = object_key(obj)
    labels = (obj.get("metadata") or {}).get("labels") or {}
    service = str(labels.get(SERVICE_NAME_LABEL) or "")
    if not (is_label(namespace) and is_label(service)) or obj.get("addressType") == "FQDN":
        return None
    raw = obj.get("endpoints")
    endpoints = tuple(e for e in map(_endpoint, raw if isinstance(raw, list) else ()) if e)
    return SliceInfo(
        namespace, name, service, pack_endpoints(endpoints), _named_ports(obj.get("ports"))
    )


def pack_endpoints(endpoints: Iterable[Endpoint]) -> str:
    """Endpoints as one string, one line each: ``R`` (ready) or ``N``, the hostname, a
    space, the addresses joined by commas. Hostnames are DNS labels and addresses are
    normalized, so neither holds a space, a comma or a newline."""
    return "\n".join(
        f"{'R' if e.ready else 'N'}{e.hostname or ''} {','.join(e.addresses)}" for e in endpoints
    )


def unpack_endpoints(packed: str) -> tuple[Endpoint, ...]:
    """The endpoints ``pack_endpoints`` packed."""
    found = []
    for line in packed.split("\n") if packed else ():
        hostname, _, addresses = line[1:].partition(" ")
        found.append(Endpoint(tuple(addresses.split(",")), hostname or None, line[0] == "R"))
    return tuple(found)


def pod_info(obj: Obj) -> PodInfo | None:
    """The slim form of a pod that has addresses and may still use them, else None."""
    namespace, name = object_key(obj)
    status = obj.get("status") or {}
    if not is_label(namespace) or status.get("phase") in ("Succeeded", "Failed"):
        return None
    raw = [entry.get("ip") for entry in status.get("podIPs") or () if isinstance(entry, Mapping)]
    addresses = tuple(ip for ip in map(_address, raw or [status.get("podIP")]) if ip)
    return PodInfo(namespace, name, addresses) if addresses else None


# ---- records -----------------------------------------------------------------------------


def _address_type(ip: str) -> int:
    return AAAA if ":" in ip else A


def _srv(name: str, port: ServicePort, target: str) -> Record:
    return Record(f"_{port.name}._{port.protocol}.{name}", SRV, (0, 0, port.port, target))


def _weighted(records: Iterable[Record]) -> set[Record]:
    """SRV weights sharing 100 equally among the records of each name (RFC 2782)."""
    records = list(records)
    counts = Counter(r.name for r in records if r.rtype == SRV)
    out = set()
    for r in records:
        if r.rtype == SRV:
            priority, _, port, target = r.data
            r = Record(r.name, SRV, (priority, max(1, 100 // counts[r.name]), port, target))
        out.add(r)
    return out


def _cluster_ip_records(svc: ServiceInfo, name: str) -> list[Record]:
    found = []
    for ip in svc.cluster_ips:
        found.append(Record(name, _address_type(ip), (ip,)))
        found.append(Record(reverse_name(ip), PTR, (name,)))
    found.extend(_srv(name, port, name) for port in svc.ports)
    return found


def _headless_records(svc: ServiceInfo, name: str, slices: Iterable[SliceInfo]) -> list[Record]:
    found = []
    for piece in slices:
        for endpoint in piece.endpoints:
            if not (endpoint.ready or svc.publish_not_ready):
                continue
            for ip in endpoint.addresses:
                host = f"{endpoint.hostname or dashed(ip)}.{name}"
                found.append(Record(name, _address_type(ip), (ip,)))
                found.append(Record(host, _address_type(ip), (ip,)))
                found.append(Record(reverse_name(ip), PTR, (host,)))
                found.extend(_srv(name, port, host) for port in piece.ports)
    return found


def service_records(svc: ServiceInfo, slices: Iterable[SliceInfo], zone: str) -> frozenset[Record]:
    """Every record a Service stands for (its EndpointSlices matter when headless)."""
    name = f"{svc.name}.{svc.namespace}.svc.{zone}"
    if svc.external_name is not None:
        found = [Record(name, CNAME, (svc.external_name,))] if svc.external_name else []
    elif svc.headless:
        found = _headless_records(svc, name, slices)
    else:
        found = _cluster_ip_records(svc, name)
    return frozenset(r for r in _weighted(found) if len(r.name) <= MAX_NAME)


def soa_record(apex: str, zone: str, ttl: int) -> Record:
    """The SOA of ``apex`` (the cluster zone or a reverse zone); its minimum (the
    negative-caching time) is the records' TTL."""
    return Record(apex, SOA, (f"ns.dns.{zone}", f"hostmaster.{zone}", 1, *SOA_TIMERS, ttl))


def zone_records(zone: str, ttl: int) -> frozenset[Record]:
    """The records of the zone itself: SOA, NS and the schema version."""
    return frozenset(
        {
            soa_record(zone, zone, ttl),
            Record(zone, NS, (f"ns.dns.{zone}",)),
            Record(f"dns-version.{zone}", TXT, (SCHEMA_VERSION,)),
        }
    )
