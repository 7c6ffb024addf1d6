"""The endpoints controller: keeps Endpoints and EndpointSlices equal to the selected pods.

It follows Services, Pods, Endpoints and EndpointSlices (the ones it manages), and
queues a Service's ``namespace/name`` whenever any of them changes: the Service itself,
a pod its selector matches before or after the change, its Endpoints, or one of its
slices. Reconciling a Service computes the desired objects (``endpointsdesired``,
``endpointslicesdesired``: pure functions of the Service and its pods), compares them
with what the caches hold and writes only what differs, each write a read-modify-write
(``guaranteed_update``) so a concurrent edit is not lost or overwritten blindly.

What it leaves alone: the Endpoints of a Service without a selector (its users write
them; it mirrors them into slices, ``endpointsmirror``) and of an ExternalName Service,
and slices it did not write (another ``managed-by``). A deleted Service loses the
Endpoints and slices the controller wrote. Every resync period the listings run through
the same handlers, so someone editing or deleting a managed object is repaired.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from podnet.client.errors import has_reason
from podnet.client.watch import DELETED
from podnet.controllers.base import Controller, Watch, is_marker
from podnet.controllers.cache import ObjectCache, namespaced_key, revision_of
from podnet.controllers.calls import (
    ControllerApi,
    call,
    delete_if_present,
    guaranteed_update,
)
from podnet.controllers.endpointsdesired import (
    OVER_CAPACITY,
    desired_endpoints,
    endpoints_differ,
    is_managed_endpoints,
    manages,
    meta_of,
    selector_of,
    selects,
    spec_of,
)
from podnet.controllers.endpointsindex import PodIndex, ServiceIndex, follow
from podnet.controllers.endpointslicesdesired import (
    desired_slices,
    is_managed_slice,
    service_name_of,
    slice_differs,
)
from podnet.controllers.endpointsmirror import mirrored_slices, mirrors
from podnet.controllers.endpointspods import PodShrinker
from podnet.model.kinds import ENDPOINT_SLICE, ENDPOINTS, POD, SERVICE, Kind

Obj = dict[str, Any]
Differs = Callable[[Obj, Obj], bool]
Apply = Callable[[Obj, Obj], Obj]
WORKERS = 8


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


class EndpointsController(Controller):
    """Writes each selector Service's Endpoints and EndpointSlices."""

    name = "endpoints"

    def __init__(self, api: ControllerApi, resync_period: float | None = 300.0) -> None:
        super().__init__(api, WORKERS, resync_period)
        self.services = ServiceIndex()
        self.pods = PodIndex()
        self._shrink = PodShrinker()  # pods are kept small: there may be 150,000
        self.endpoints = ObjectCache(namespaced_key)
        self.slices = ObjectCache(namespaced_key)
        self._slices_of: dict[str, set[str]] = {}  # service key -> slice keys

    def watches(self) -> list[Watch]:
        """Services first, so that pods listed next find the Services selecting them."""
        return [
            Watch(SERVICE, self._on_service),
            # Pods are not listed again each resync period: there may be 150,000, and
            # listing them stopped the master's event loop (every watcher too) for
            # seconds every 5 minutes. Their stream comes from the watch cache whole;
            # a 410 still brings a new listing, and the controller's own objects
            # (Endpoints, slices) are still listed again, which repairs their drift.
            Watch(POD, self._on_pod, resync=False),
            Watch(ENDPOINTS, self._on_endpoints),
            Watch(ENDPOINT_SLICE, self._on_slice),
        ]

    def summary(self) -> str:
        return f"{len(self.services)} services, {len(self.pods)} pods, {len(self.slices)} slices"

    # ---- events -------------------------------------------------------------------------

    def _on_service(self, change: str, obj: Obj) -> None:
        if not is_marker(self.services.cache, change, obj):
            follow(self.services, change, obj)
            self.queue.add(namespaced_key(obj))

    def _on_pod(self, change: str, obj: Obj) -> None:
        if is_marker(self.pods.cache, change, obj):
            return
        versions = follow(self.pods, change, self._shrink(obj)) or []
        candidates = set().union(*(self.services.candidates(v) for v in versions))
        for service_key in candidates:
            service = self.services.get(service_key)
            if service is not None and any(selects(service, v) for v in versions):
                self.queue.add(service_key)

    def _on_endpoints(self, change: str, obj: Obj) -> None:
        # The controller's own writes are cached already: their events change nothing.
        if not is_marker(self.endpoints, change, obj) and follow(self.endpoints, change, obj):
            self.queue.add(namespaced_key(obj))

    def _on_slice(self, change: str, obj: Obj) -> None:
        if is_marker(self.slices, change, obj):
            return
        key = namespaced_key(obj)
        old = self.slices.get(key)
        if change == DELETED or not is_managed_slice(obj):  # gone, or taken over
            self._forget_slice(key, revision_of(obj))
        elif not self._remember_slice(obj):
            return  # stale, or the controller's own write (cached already)
        for version in (old, obj):
            if version is not None and (owner := self._service_key_of(version)):
                self.queue.add(owner)

    @staticmethod
    def _service_key_of(slice_obj: Obj) -> str | None:
        service = service_name_of(slice_obj)
        namespace = meta_of(slice_obj).get("namespace") or ""
        return f"{namespace}/{service}" if service else None

    def _remember_slice(self, obj: Obj) -> bool:
        """Cache a managed slice version; False when it is not newer than the cached."""
        key = namespaced_key(obj)
        stored, old = self.slices.put(obj)
        if not stored:
            return False
        if old is not None and (was := self._service_key_of(old)):
            self._slices_of.get(was, set()).discard(key)
        if owner := self._service_key_of(obj):
            self._slices_of.setdefault(owner, set()).add(key)
        return True

    def _forget_slice(self, key: str, revision: int) -> None:
        old = self.slices.remove(key, revision)
        if old is not None and (owner := self._service_key_of(old)):
            members = self._slices_of.get(owner, set())
            members.discard(key)
            if not members:
                self._slices_of.pop(owner, None)

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        service = self.services.get(key)
        await self._sync_endpoints(key, service)
        await self._sync_slices(key, service)

    def _pods_for(self, service: Obj) -> list[Obj]:
        namespace = str(meta_of(service).get("namespace") or "")
        return self.pods.matching(namespace, selector_of(service))

    async def _sync_endpoints(self, key: str, service: Obj | None) -> None:
        current = self.endpoints.get(key)
        if service is None or spec_of(service).get("type") == "ExternalName":
            if current is not None and is_managed_endpoints(current):
                await self._delete(ENDPOINTS, self.endpoints, current)
            return
        if not manages(service):
            return  # selectorless: its users write its Endpoints
        desired = desired_endpoints(service, self._pods_for(service))
        if current is None or endpoints_differ(current, desired):
            written = await self._write(
                ENDPOINTS, desired, current, endpoints_differ, _apply_endpoints
            )
            if written is not None:
                self.endpoints.put(written)

    async def _sync_slices(self, key: str, service: Obj | None) -> None:
        current = {k: obj for k in self._slices_of.get(key, set()) if (obj := self.slices.get(k))}
        desired: dict[str, Obj] = {}
        if service is not None and manages(service):
            desired = desired_slices(service, self._pods_for(service), current.values())
        elif service is not None and mirrors(service, endpoints := self.endpoints.get(key)):
            desired = mirrored_slices(endpoints or {}, current.values())
        namespace, _ = _split(key)
        for name, want in desired.items():
            have = current.get(f"{namespace}/{name}")
            if have is None or slice_differs(have, want):
                written = await self._write(ENDPOINT_SLICE, want, have, slice_differs, _apply_slice)
                if written is not None:
                    self._remember_slice(written)
        for slice_key, have in current.items():
            if _split(slice_key)[1] not in desired:
                await self._delete(ENDPOINT_SLICE, self.slices, have)
                self._forget_slice(slice_key, revision_of(have))

    # ---- writes -------------------------------------------------------------------------

    async def _write(
        self, kind: Kind, desired: Obj, current: Obj | None, differs: Differs, apply: Apply
    ) -> Obj | None:
        """Bring the stored object to ``desired``; the stored result (None: nothing to do).

        With a cached ``current``, one update pinned to its version; after a conflict (the
        cache was behind) a read-modify-write; if it is gone, a create. Without one, a
        create, and after AlreadyExists the read-modify-write.
        """
        namespace = str(desired["metadata"]["namespace"])
        name = str(desired["metadata"]["name"])
        what = f"{kind.singular} {namespace}/{name}"

        def mutate(stored: Obj) -> Obj | None:
            return apply(stored, desired) if differs(stored, desired) else None

        try:
            if current is None:
                return await call(
                    lambda: self.api.create(kind, desired, namespace), f"create {what}"
                )
            pinned = apply(copy.deepcopy(current), desired)
            return await call(lambda: self.api.update(kind, pinned), f"update {what}")
        except Exception as exc:
            if has_reason(exc, "NotFound"):
                return await call(
                    lambda: self.api.create(kind, desired, namespace), f"create {what}"
                )
            if not has_reason(exc, "AlreadyExists", "Conflict"):
                raise
        return await guaranteed_update(self.api, kind, namespace, name, mutate)

    async def _delete(self, kind: Kind, cache: ObjectCache, obj: Obj) -> None:
        meta = meta_of(obj)
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name"))
        await delete_if_present(self.api, kind, namespace, name)
        cache.remove(f"{namespace}/{name}", revision_of(obj))


def _apply_endpoints(stored: Obj, desired: Obj) -> Obj:
    """``stored`` with the controller's fields (subsets, labels, over-capacity) set."""
    meta = stored.setdefault("metadata", {})
    want = desired["metadata"]
    meta["labels"] = want["labels"]
    annotations = dict(meta.get("annotations") or {})
    annotations.pop(OVER_CAPACITY, None)
    annotations.update(want.get("annotations") or {})
    meta["annotations"] = annotations
    stored.pop("subsets", None)
    if desired.get("subsets"):
        stored["subsets"] = desired["subsets"]
    return stored


def _apply_slice(stored: Obj, desired: Obj) -> Obj:
    """``stored`` with the controller's fields (type, endpoints, ports, labels, owner)."""
    meta = stored.setdefault("metadata", {})
    want = desired["metadata"]
    meta["labels"] = want["labels"]
    meta["ownerReferences"] = want.get("ownerReferences") or []
    for field in ("addressType", "endpoints", "ports"):
        stored[field] = desired[field]
    return stored
