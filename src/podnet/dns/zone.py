"""The zone index: every record of the cluster zone, kept up to date one object at a time.

A change to a Service, an EndpointSlice or a Pod recomputes the records of that one
source (a service with its slices, or a pod) and applies the difference to a table of
names. No change rebuilds the zone: a service update costs what its own records cost.

The table counts each record by how many sources hold it (two headless services may
share an endpoint address, whose PTR both give), and counts for every name how many
owners lie at or below it, so an empty non-terminal (``<ns>.svc.<zone>``, the parent of
an SRV name) exists: it answers NODATA, not NXDOMAIN.

Every change reports the names whose answers may differ (records changed, or existence
changed) to ``on_change``: the server's answer cache drops exactly those.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from podnet.dns.counting import count
from podnet.dns.names import ZONE, address_of_reverse, ancestors, reverse_zone, within
from podnet.dns.podrecords import VERIFIED, PodAddresses
from podnet.dns.records import (
    Key,
    Record,
    ServiceInfo,
    SliceInfo,
    object_key,
    pod_info,
    service_info,
    service_records,
    slice_info,
    soa_record,
    zone_records,
)

DEFAULT_TTL = 5  # seconds, as CoreDNS
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Source = tuple[str, str, str]  # ("svc" | "zone", namespace, name)
Obj = Mapping[str, Any]
NO_RECORDS: Mapping[Record, int] = {}


class ZoneIndex:
    """The records of ``zone`` (and of the reverse zones of ``reverse_networks``), fed by
    ``put_*``/``remove_*`` and read by ``podnet.dns.lookup``."""

    def __init__(
        self,
        zone: str = ZONE,
        reverse_networks: Iterable[Network] = (),
        ttl: int = DEFAULT_TTL,
        on_change: Callable[[set[str]], None] | None = None,
        pod_records: str = VERIFIED,
    ) -> None:
        self.zone = zone
        self.ttl = ttl
        self.on_change = on_change
        self.networks = tuple(reverse_networks)
        self.services: dict[Key, ServiceInfo] = {}
        self.slices: dict[Key, SliceInfo] = {}
        self.pod_addresses = PodAddresses(zone, pod_records)
        self.pods = self.pod_addresses.pods  # (namespace, name) -> addresses
        self._slices_of: dict[Key, set[Key]] = {}  # service key -> its slices' keys
        self._sources: dict[Source, frozenset[Record]] = {}
        self._table: dict[str, dict[Record, int]] = {}
        self._below: dict[str, int] = {}  # name -> owners at or below it
        self._set(("zone", "", ""), zone_records(zone, ttl))

    # ---- reading -------------------------------------------------------------------------

    def records(self, name: str) -> Mapping[Record, int]:
        """The records owned by ``name`` (normalized), with their source counts."""
        found = self._table.get(name)
        return found if found is not None else self.pod_addresses.records(name)

    def exists(self, name: str) -> bool:
        """Whether ``name`` owns records or has a descendant that does."""
        return name in self._below or self.pod_addresses.exists(name)

    def apex_of(self, name: str) -> str | None:
        """The zone this server is authoritative for that holds ``name``, else None:
        the cluster zone, or the reverse zone of a complete reverse name whose address is
        in a reverse network."""
        if within(name, self.zone):
            return self.zone
        address = address_of_reverse(name)
        if address is None:
            return None
        for network in self.networks:
            if address.version == network.version and address in network:
                return reverse_zone(network)
        return None

    def soa(self, apex: str) -> Record:
        """The SOA put in the authority section of a negative answer under ``apex``."""
        return soa_record(apex, self.zone, self.ttl)

    @property
    def size(self) -> int:
        """How many names own records."""
        return len(self._table)

    # ---- services and their slices -------------------------------------------------------

    def put_service(self, obj: Obj) -> None:
        """Add or update a Service."""
        info = service_info(obj)
        if info is None:
            return
        if self.services.get(info.key) != info:
            self.services[info.key] = info
            self._refresh_service(info.key)

    def remove_service(self, key: Key) -> None:
        """Forget a Service (its slices stay, for when it comes back)."""
        if self.services.pop(key, None) is not None:
            self._refresh_service(key)

    def put_slice(self, obj: Obj) -> None:
        """Add or update an EndpointSlice."""
        info = slice_info(obj)
        if info is None:
            # A slice that no longer names a service (or never did) leaves its old one.
            self.remove_slice(object_key(obj))
            return
        old = self.slices.get(info.key)
        if old == info:
            return
        self.slices[info.key] = info
        self._slices_of.setdefault(info.service_key, set()).add(info.key)
        if old is not None and old.service_key != info.service_key:
            self._forget_slice(old)
        self._refresh_headless(info.service_key)

    def remove_slice(self, key: Key) -> None:
        """Forget an EndpointSlice."""
        old = self.slices.pop(key, None)
        if old is not None:
            self._forget_slice(old)

    def _forget_slice(self, old: SliceInfo) -> None:
        keys = self._slices_of.get(old.service_key, set())
        keys.discard(old.key)
        if not keys:
            self._slices_of.pop(old.service_key, None)
        self._refresh_headless(old.service_key)

    def _refresh_headless(self, key: Key) -> None:
        """A slice changed: only a headless service's records depend on its slices."""
        svc = self.services.get(key)
        if svc is not None and svc.headless:
            self._refresh_service(key)

    def _refresh_service(self, key: Key) -> None:
        svc = self.services.get(key)
        if svc is None:
            self._set(("svc", *key), frozenset())
            return
        current = (self.slices[k] for k in sorted(self._slices_of.get(key, ())))
        found = service_records(svc, current, self.zone)
        self._set(("svc", *key), found)

    # ---- pods ----------------------------------------------------------------------------

    def put_pod(self, obj: Obj) -> None:
        """Add or update a pod (a pod without addresses, or finished, has no records)."""
        info = pod_info(obj)
        self._put_pod(object_key(obj), info.addresses if info is not None else ())

    def remove_pod(self, key: Key) -> None:
        """Forget a pod."""
        self._put_pod(key, ())

    def _put_pod(self, key: Key, addresses: tuple[str, ...]) -> None:
        changed: set[str] = set()
        self.pod_addresses.put(key, addresses, changed)
        if changed and self.on_change is not None:
            self.on_change(changed)

    # ---- the table -----------------------------------------------------------------------

    def _set(self, source: Source, records: frozenset[Record]) -> None:
        """Make ``source`` hold exactly ``records``; report the names that changed."""
        old = self._sources.get(source, frozenset())
        if old == records:
            return
        if records:
            self._sources[source] = records
        else:
            self._sources.pop(source, None)
        changed: set[str] = set()
        for record in records - old:  # adds first: a name kept throughout never flips
            self._add(record, changed)
        for record in old - records:
            self._drop(record, changed)
        if changed and self.on_change is not None:
            self.on_change(changed)

    def _add(self, record: Record, changed: set[str]) -> None:
        owned = self._table.get(record.name)
        if owned is None:
            owned = self._table[record.name] = {}
            self._count_owner(record.name, 1, changed)
        owned[record] = owned.get(record, 0) + 1
        changed.add(record.name)

    def _drop(self, record: Record, changed: set[str]) -> None:
        owned = self._table[record.name]
        count = owned[record] - 1
        if count:
            owned[record] = count
        else:
            del owned[record]
        changed.add(record.name)
        if not owned:
            del self._table[record.name]
            self._count_owner(record.name, -1, changed)

    def _count_owner(self, name: str, delta: int, changed: set[str]) -> None:
        """Count an owner that appeared (+1) or went (-1) at ``name`` and above it, up to
        its apex (or the name alone outside any zone); note names whose existence flips."""
        apex = self.apex_of(name) or name
        for above in ancestors(name, apex):
            if count(self._below, above, delta):
                changed.add(above)
