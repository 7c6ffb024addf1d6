"""What the router knows of the cluster: Routes, Services and EndpointSlices, kept from
their watch events, and a snapshot of them for the desired-state step.

``RouterInputs.take(kind, event)`` keeps one kind's objects (``LISTED`` replaces them
all) and says what the event changed:

- ``SPEC``: something the routing table depends on (a route's spec, labels or
  annotations, a Service, a slice's ready endpoints): compute the table again;
- ``STATUS``: only a route's status (what a router wrote): nothing to route
  differently, but the route's ``status.ingress`` may need writing again;
- ``NOTHING``: the event changes nothing the router uses (a slice's resourceVersion).

Slices are reduced on arrival to their ready endpoint ports (``desired.slice_endpoints``)
and gathered by Service (label ``kubernetes.io/service-name``); Routes are kept whole,
admission reads their creation time and uid, the status writer their status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from podnet.client import DELETED, LISTED, WatchEvent
from podnet.model.kinds import ENDPOINT_SLICE, SERVICE
from podnet.model.schemas_discovery import SERVICE_NAME_LABEL
from podnet.router.desired import (
    EndpointPort,
    ServiceEndpoints,
    ServiceKey,
    merge_endpoints,
    slice_endpoints,
)

Obj = Mapping[str, Any]
RouteKey = tuple[str, str]  # (namespace, name)


class Change(Enum):
    """What an event changed, for the router (module docstring)."""

    NOTHING = 0
    STATUS = 1
    SPEC = 2


NOTHING, STATUS, SPEC = Change.NOTHING, Change.STATUS, Change.SPEC


@dataclass(frozen=True)
class Snapshot:
    """The inputs at one moment, for the desired-state step (safe to read in a thread:
    the dicts are copies, the objects are not changed in place)."""

    routes: tuple[Obj, ...]
    services: Mapping[ServiceKey, Obj]
    endpoints: Mapping[ServiceKey, ServiceEndpoints]


def object_key(obj: Obj) -> tuple[str, str]:
    """(namespace, name) of an object."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def routing_part(route: Obj) -> tuple[Any, ...]:
    """What of a route the table and admission read: all but status and versions."""
    meta = route.get("metadata") or {}
    identity = (meta.get("uid"), meta.get("creationTimestamp"), meta.get("annotations"))
    return identity, meta.get("labels"), route.get("spec")


@dataclass
class RouterInputs:
    """The router's view of Routes, Services and EndpointSlices."""

    routes: dict[RouteKey, Obj] = field(default_factory=dict)
    services: dict[ServiceKey, Obj] = field(default_factory=dict)
    # (namespace, service) -> slice name -> its ready endpoint ports
    slices: dict[ServiceKey, dict[str, tuple[EndpointPort, ...]]] = field(default_factory=dict)
    endpoints: dict[ServiceKey, ServiceEndpoints] = field(default_factory=dict)
    _slice_owner: dict[tuple[str, str], ServiceKey] = field(default_factory=dict)

    def take(self, kind: str, event: WatchEvent) -> Change:
        """Keep one event of ``kind`` (a plural: routes, services, endpointslices)."""
        if event.type == LISTED:
            return self._relist(kind, event.items)
        deleted = event.type == DELETED
        if kind == SERVICE.plural:
            return self._service(event.object, deleted)
        if kind == ENDPOINT_SLICE.plural:
            return self._slice(event.object, deleted)
        return self._route(event.object, deleted)

    def snapshot(self) -> Snapshot:
        """A copy of the current view."""
        return Snapshot(tuple(self.routes.values()), dict(self.services), dict(self.endpoints))

    def _relist(self, kind: str, items: Iterable[Obj]) -> Change:
        if kind == SERVICE.plural:
            self.services = {object_key(o): o for o in items}
        elif kind == ENDPOINT_SLICE.plural:
            self.slices, self.endpoints, self._slice_owner = {}, {}, {}
            for item in items:
                self._slice(item, False)
        else:
            self.routes = {object_key(o): o for o in items}
        return SPEC

    def _route(self, route: Obj, deleted: bool) -> Change:
        key = object_key(route)
        old = self.routes.pop(key, None) if deleted else self.routes.get(key)
        if deleted:
            return SPEC if old is not None else NOTHING
        self.routes[key] = route
        if old is not None and routing_part(old) == routing_part(route):
            return STATUS if old.get("status") != route.get("status") else NOTHING
        return SPEC

    def _service(self, service: Obj, deleted: bool) -> Change:
        key = object_key(service)
        if deleted:
            return SPEC if self.services.pop(key, None) is not None else NOTHING
        old, self.services[key] = self.services.get(key), service
        return SPEC if old is None or old.get("spec") != service.get("spec") else NOTHING

    def _slice(self, endpoint_slice: Obj, deleted: bool) -> Change:
        namespace, name = object_key(endpoint_slice)
        labels = (endpoint_slice.get("metadata") or {}).get("labels") or {}
        service = str(labels.get(SERVICE_NAME_LABEL) or "")
        before = self._slice_owner.pop((namespace, name), None)
        old = self.slices.get(before, {}).pop(name, None) if before else None
        owner = (namespace, service) if service and not deleted else None
        found = tuple(slice_endpoints(endpoint_slice)) if owner else None
        if owner is not None and found is not None:
            self._slice_owner[(namespace, name)] = owner
            self.slices.setdefault(owner, {})[name] = found
        if owner == before and old == found:
            return NOTHING
        for key in {before, owner}:
            if key is not None:
                self._gather(key)
        return SPEC

    def _gather(self, owner: ServiceKey) -> None:
        """Merge one Service's slices into its endpoints (none left: forget it)."""
        by_slice = self.slices.get(owner) or {}
        merged = merge_endpoints(by_slice.values())
        if merged:
            self.endpoints[owner] = merged
        else:
            self.endpoints.pop(owner, None)
        if not by_slice:
            self.slices.pop(owner, None)
