"""The object API inside the master: the registry for writes and fresh reads, the watch
cache for lists and watches.

The leader's controllers use it instead of the HTTPS client: a write goes through the
same registry (validation, claims, preconditions) a user's does, a ``get`` reads etcd, a
list is the watch cache's consistent list (etcd's current revision, one round trip
without data, then the cache once it has reached it; etcd itself if it does not within
``CONSISTENT_WAIT``), and a watch is one more cursor into the master's watch cache, so
the controllers open no etcd watch of their own. A watch from a revision older than the
cache holds reads etcd directly (as the API server does) and ends with ``Expired`` once
etcd has compacted it. Errors are translated into the client's tree
(``podnet.client.errors``), so a controller handles the same exceptions whichever API it
is given. Every object handed out is a fresh dict: a controller may keep and change it.

Given a ``user`` (the master gives its controllers the controllers' identity), every
call is authorized as that user's would be over HTTPS: the rules
(``podnet.api.authorizer``), and for writes ControllerRestriction inside the registry's
write, with the objects. Without one (tests, tools) nothing is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from podnet.api.authorizer import RequestAttributes, require_authorized, require_rule
from podnet.api.cachedobjects import CachedEvent, WatchFilter
from podnet.api.controllerrestriction import ControllerRestriction
from podnet.api.identity import User
from podnet.api.listing import CONSISTENT_WAIT
from podnet.api.registry import Admit, Registry
from podnet.api.watchcache import WatchCache, direct_events
from podnet.client.errors import error_from_status
from podnet.client.objectapi import Listing
from podnet.client.watch import BOOKMARK, EventType, ResourceVersion, WatchEvent, bookmark
from podnet.model import errors
from podnet.model.kinds import NAMESPACE, Kind
from podnet.store.base import StoreUnavailable

Obj = dict[str, Any]
T = TypeVar("T")
Precondition = ResourceVersion | None  # a delete's: only at this version
BOOKMARK_EVERY = 10.0  # seconds of silence before a watch says "up to date to here"
DECODE_BATCH = 500  # objects decoded between two turns of the event loop


async def _translated(work: Awaitable[T]) -> T:
    """``work``'s result, with registry and store errors as the client's errors."""
    try:
        return await work
    except errors.ApiError as exc:
        raise error_from_status(exc.message, exc.code, exc.reason) from exc
    except StoreUnavailable as exc:
        raise error_from_status(f"storage unavailable: {exc}", 503, "ServiceUnavailable") from exc


class InProcessApi:
    """``ObjectApi`` (plus the controllers' extras) over a registry and its watch cache."""

    def __init__(self, registry: Registry, cache: WatchCache, user: User | None = None) -> None:
        self.registry = registry
        self.cache = cache
        self.user = user
        self.restriction = ControllerRestriction.over(registry, cache)

    def _may(self, verb: str, kind: Kind, namespace: str | None, name: str | None) -> None:
        """Raise 403 unless ``user``'s rules allow ``verb`` (before anything is read)."""
        if self.user is not None:
            attrs = RequestAttributes(verb, kind, namespace, name, None, None, None)
            _raise_translated(lambda: require_rule(self.user, attrs))  # type: ignore[arg-type]

    def _admit(
        self, verb: str, kind: Kind, namespace: str | None, name: str | None, sub: str | None
    ) -> Admit:
        """The registry's ``admit`` for a write as ``user``: the rules, then
        ControllerRestriction, with the objects (nothing without a user)."""
        user = self.user

        async def admit(new: Obj | None, old: Obj | None) -> None:
            if user is None:
                return
            attrs = RequestAttributes(verb, kind, namespace, name, sub, new, old)
            require_authorized(user, attrs)
            if user.is_controllers and not user.is_admin:
                await self.restriction.check(user, attrs)

        return admit

    @classmethod
    @contextlib.asynccontextmanager
    async def standalone(cls, registry: Registry) -> AsyncIterator[InProcessApi]:
        """An API over ``registry`` with a watch cache of its own (tests, tools), stopped
        on exit. The master passes the API server's cache instead."""
        cache = WatchCache(registry)
        await cache.start()
        try:
            yield cls(registry, cache)
        finally:
            await cache.stop()

    async def list(self, kind: Kind, namespace: str | None = None) -> Listing:
        self._may("list", kind, namespace, None)
        current = await _translated(self.registry.store.revision())
        if not await self.cache.wait_for(current, CONSISTENT_WAIT):
            items, revision = await _translated(self.registry.list(kind, namespace))
            return Listing(items, revision)
        view, revision = self.cache.objects(kind, namespace)
        selected = list(view)  # the cache changes across the awaits below: take it now
        items = []
        for start in range(0, len(selected), DECODE_BATCH):
            items.extend(cached.obj for _, cached in selected[start : start + DECODE_BATCH])
            await asyncio.sleep(0)  # a list of every pod decodes for seconds: let others in
        return Listing(items, revision)

    async def namespaces_in_use(self, kind: Kind) -> set[str]:
        """The namespaces holding an object of ``kind``, read as consistently as ``list``
        from the cache's keys: no object is decoded (150,000 pods cost milliseconds)."""
        current = await _translated(self.registry.store.revision())
        if not await self.cache.wait_for(current, CONSISTENT_WAIT):
            items, _ = await _translated(self.registry.list(kind))
            return {obj["metadata"]["namespace"] for obj in items}
        return self.cache.namespaces(kind)[0]

    async def watch(
        self, kind: Kind, since: ResourceVersion, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        self._may("watch", kind, namespace, None)
        if self.cache.covers(since):
            source = self.cache.follow(since, BOOKMARK_EVERY, kind)  # woken by kind only
        else:
            source = direct_events(self.registry, since, kind, namespace)
        wanted = WatchFilter(kind, namespace)
        try:
            while True:
                item = await _translated(_next(source))
                if item is None:
                    return
                event = _event(wanted, item)
                if event is not None:
                    yield event
        finally:
            with contextlib.suppress(Exception):
                await source.aclose()  # type: ignore[attr-defined]

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        self._may("get", kind, namespace, name)
        return await _translated(self.registry.get(kind, namespace, name))

    async def create(self, kind: Kind, obj: Obj, namespace: str | None = None) -> Obj:
        where = namespace or (obj.get("metadata") or {}).get("namespace")
        admit = self._admit("create", kind, where, None, None)
        self._may("create", kind, where, None)
        return await _translated(self.registry.create(kind, obj, namespace, admit))

    async def update(self, kind: Kind, obj: Obj) -> Obj:
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace"), str(meta.get("name"))
        self._may("update", kind, namespace, name)
        admit = self._admit("update", kind, namespace, name, None)
        return await _translated(self.registry.update(kind, obj, namespace, name, None, admit))

    async def update_status(self, kind: Kind, obj: Obj) -> Obj:
        """Replace the object's status only (the ``status`` subresource)."""
        meta = obj.get("metadata") or {}
        name, namespace = str(meta.get("name")), meta.get("namespace")
        admit = self._admit("update", kind, namespace, name, "status")
        return await _translated(self.registry.update(kind, obj, namespace, name, "status", admit))

    async def delete(
        self, kind: Kind, namespace: str | None, name: str, *, resource_version: Precondition = None
    ) -> None:
        version = None if resource_version is None else str(resource_version)
        self._may("delete", kind, namespace, name)
        admit = self._admit("delete", kind, namespace, name, None)
        await _translated(self.registry.delete(kind, namespace, name, version, admit))

    async def finalize_namespace(self, name: str) -> None:
        """Remove a Terminating Namespace whose contents are gone."""
        if self.user is not None:
            attrs = RequestAttributes("update", NAMESPACE, None, name, "finalize", None, None)
            _raise_translated(lambda: require_authorized(self.user, attrs))  # type: ignore[arg-type]
        current = await self.get(NAMESPACE, None, name)
        if not current["metadata"].get("deletionTimestamp"):
            message = f'Operation cannot be fulfilled on namespaces "{name}": it is not terminating'
            raise error_from_status(message, 409, "Conflict")
        await _translated(self.registry.finalize_namespace(name))


def _raise_translated(check: Callable[[], None]) -> None:
    """Run an authorization ``check``; its 403 as the client's error."""
    try:
        check()
    except errors.ApiError as exc:
        raise error_from_status(exc.message, exc.code, exc.reason) from exc


async def _next(source: AsyncIterator[CachedEvent | int]) -> CachedEvent | int | None:
    try:
        return await anext(source)
    except StopAsyncIteration:
        return None


def _event(wanted: WatchFilter, item: CachedEvent | int) -> WatchEvent | None:
    """What a watcher of ``wanted`` sees of one cache item (None: nothing)."""
    if isinstance(item, int):
        return WatchEvent(BOOKMARK, bookmark(item))
    seen = wanted.view(item)
    if seen is None:
        return None
    return WatchEvent(EventType(seen), item.obj)  # decoded afresh for each call
