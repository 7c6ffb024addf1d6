"""ControllerRestriction: what the controllers may put in the objects they write, by job.

The rules (``podnet.api.roles.CONTROLLER_JOBS``) say which verbs each controller job
uses on which kinds; like NodeRestriction for nodes, this check looks at the objects,
because what makes a controller's write legitimate is its content:

- the endpoints controller writes the Endpoints of a Service with a selector, and the
  EndpointSlices labelled ``endpointslice.kubernetes.io/managed-by:
  endpointslice-controller.k8s.io`` of such a Service (``kubernetes.io/service-name``),
  and every address it publishes is a pod's of that namespace: a stolen controllers
  token cannot send a Service's traffic to an outside host (the CVE-2020-8554 pattern).
  Slices mirrored from the hand-written Endpoints of a Service without a selector
  (``managed-by: endpointslicemirroring-controller.k8s.io``) hold only addresses those
  Endpoints hold. An update must find the slice already managed by one of the two; a
  delete in a live namespace is of a managed slice, or of Endpoints the controller
  wrote (label ``endpoints.kubernetes.io/managed-by: endpoint-controller``);
- the namespace controller deletes only in a Namespace that is terminating (or gone:
  the orphan sweep). No controller deletes anything else in a live Namespace, so not a
  pod, a Service or a NetworkPolicy.

The checks need the registry (the Service, the Namespace, the holders of an address);
they run in admission for the HTTPS API (``podnet.api.admission``) and in the
registry's write for the master's in-process controllers (``podnet.controllers.inprocess``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Set
from typing import Any

from podnet.api.addressholders import address_holders
from podnet.api.authorizer import READ_VERBS, RequestAttributes, forbidden_error
from podnet.api.identity import User
from podnet.api.registry import Registry
from podnet.api.watchcache import WatchCache
from podnet.controllers.endpointsdesired import is_managed_endpoints, labels_of, manages
from podnet.controllers.endpointslicesdesired import (
    MIRROR_CONTROLLER,
    SLICE_CONTROLLER,
    is_managed_slice,
)
from podnet.model import errors
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS, NAMESPACE, SERVICE, Kind
from podnet.model.schemas_discovery import MANAGED_BY_LABEL, SERVICE_NAME_LABEL

Obj = Mapping[str, Any]
Getter = Callable[[Kind, str | None, str], Awaitable[Obj]]
Holders = Callable[[Set[str]], Awaitable[dict[str, set[str]]]]


def _same(kind: Kind, other: Kind) -> bool:
    return (kind.group, kind.plural) == (other.group, other.plural)


def endpoints_ips(endpoints: Obj | None) -> set[str]:
    """Every address of an Endpoints object, ready or not."""
    out: set[str] = set()
    for subset in (endpoints or {}).get("subsets") or []:
        for field in ("addresses", "notReadyAddresses"):
            out.update(_ips(subset.get(field) if isinstance(subset, Mapping) else None))
    return out


def slice_ips(endpoint_slice: Obj | None) -> set[str]:
    """Every address of an EndpointSlice."""
    out: set[str] = set()
    for endpoint in (endpoint_slice or {}).get("endpoints") or []:
        if isinstance(endpoint, Mapping):
            out.update(str(a) for a in endpoint.get("addresses") or [] if a)
    return out


def _ips(addresses: Iterable[Any] | None) -> set[str]:
    return {str(a["ip"]) for a in addresses or [] if isinstance(a, Mapping) and a.get("ip")}


class ControllerRestriction:
    """The object checks of the controllers' writes, over lookups of the registry."""

    def __init__(self, get: Getter, holders: Holders) -> None:
        self._get = get
        self._holders = holders

    @classmethod
    def over(cls, registry: Registry, cache: WatchCache | None) -> ControllerRestriction:
        """The checks over ``registry`` (and the watch cache's address index)."""
        return cls(registry.get, lambda ips: address_holders(registry, cache, ips))

    async def check(self, user: User, attrs: RequestAttributes) -> None:
        """Raise 403 (kube's wording) when the controllers may not make this write."""
        reason = await self.why_not(attrs)
        if reason is not None:
            raise forbidden_error(user, attrs, reason)

    async def why_not(self, attrs: RequestAttributes) -> str | None:
        """Why the controllers may not make this write, or None when they may."""
        kind = attrs.kind
        if kind is None or attrs.verb in READ_VERBS or not kind.namespaced:
            return None
        namespace = str(attrs.namespace or "")
        if attrs.verb in ("delete", "deletecollection"):
            if await self._ending(namespace):
                return None  # the namespace controller's job
            return self._live_delete(kind, namespace, attrs.old_object)
        if _same(kind, ENDPOINTS):
            return await self._endpoints(namespace, attrs.new_object)
        if _same(kind, ENDPOINT_SLICE):
            return await self._slice(namespace, attrs.new_object, attrs.old_object)
        return None

    def _live_delete(self, kind: Kind, namespace: str, old: Obj | None) -> str | None:
        if old is None:
            return None  # judged again once the object is known
        if _same(kind, ENDPOINTS) and is_managed_endpoints(dict(old)):
            return None
        if _same(kind, ENDPOINT_SLICE) and is_managed_slice(dict(old)):
            return None
        return (
            f"the controllers may delete {kind.plural} only in a namespace that is "
            f"terminating, and {namespace} is not (the endpoints controller deletes only "
            "the Endpoints and EndpointSlices it manages)"
        )

    async def _ending(self, namespace: str) -> bool:
        """Whether ``namespace`` is terminating or gone."""
        found = await self._lookup(NAMESPACE, None, namespace)
        return found is None or bool((found.get("metadata") or {}).get("deletionTimestamp"))

    async def _lookup(self, kind: Kind, namespace: str | None, name: str) -> Obj | None:
        try:
            return await self._get(kind, namespace, name)
        except errors.ApiError as exc:
            if exc.code == 404:
                return None
            raise

    async def _endpoints(self, namespace: str, new: Obj | None) -> str | None:
        if new is None:
            return None
        name = str((new.get("metadata") or {}).get("name"))
        service = await self._lookup(SERVICE, namespace, name)
        if service is None or not manages(dict(service)):
            return (
                "the endpoints controller writes only the Endpoints of a Service with a "
                f"selector, and {namespace}/{name} is none"
            )
        return await self._pods_only(namespace, endpoints_ips(new))

    async def _slice(self, namespace: str, new: Obj | None, old: Obj | None) -> str | None:
        if new is None:
            return None
        if old is not None and not is_managed_slice(dict(old)):
            return "the endpoints controller updates only the EndpointSlices it manages"
        labels = labels_of(dict(new))
        name = str(labels.get(SERVICE_NAME_LABEL) or "")
        service = await self._lookup(SERVICE, namespace, name) if name else None
        managed_by = labels.get(MANAGED_BY_LABEL)
        if managed_by == SLICE_CONTROLLER and service is not None and manages(dict(service)):
            return await self._pods_only(namespace, slice_ips(new))
        if managed_by == MIRROR_CONTROLLER and service is not None and not manages(dict(service)):
            return await self._mirrored_only(namespace, name, slice_ips(new))
        return (
            f"the endpoints controller writes only EndpointSlices labelled {MANAGED_BY_LABEL}: "
            f"{SLICE_CONTROLLER} of a Service with a selector (or {MIRROR_CONTROLLER} of one "
            f"without) named by {SERVICE_NAME_LABEL}"
        )

    async def _pods_only(self, namespace: str, ips: set[str]) -> str | None:
        holders = await self._holders(ips) if ips else {}
        for ip in sorted(ips):
            if not any(key.startswith(f"{namespace}/") for key in holders.get(ip, ())):
                return (
                    f"the endpoints controller publishes only pods' addresses, and {ip} is "
                    f"no pod's in namespace {namespace}"
                )
        return None

    async def _mirrored_only(self, namespace: str, name: str, ips: set[str]) -> str | None:
        endpoints = await self._lookup(ENDPOINTS, namespace, name)
        extra = sorted(ips - endpoints_ips(endpoints))
        if endpoints is None or is_managed_endpoints(dict(endpoints)) or extra:
            return (
                f"a mirrored EndpointSlice holds only the addresses of the hand-written "
                f"Endpoints {namespace}/{name}" + (f"; {extra[0]} is not one" if extra else "")
            )
        return None
