"""Watching API objects, and the small machinery every controller shares.

``watch_objects`` merges a listing and a watch into one stream, as client-go's reflector
does: ``("SYNC", obj)`` for every object of a full listing, then a ``("SYNCED", marker)``,
then live ``ADDED``/``MODIFIED``/``DELETED`` events. When the watch falls behind a
compaction (or the optional resync period ends) it lists again: a ``("RESYNC", marker)``,
``SYNC`` for every object, a synthesised ``DELETED`` for every object that vanished
meanwhile, and ``SYNCED``. A marker is ``{"metadata": {"resourceVersion": rev}}``.

Controllers keep an ``ObjectCache`` per kind fed from those events (and from their own
writes), and reconcile each object name in a ``workqueue.KeyedQueue``. Every API call goes
through ``call_with_retry``: a timeout per call, transient failures retried with jittered
backoff until a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from podnet.api.registry import Registry
from podnet.model.errors import ApiError
from podnet.model.kinds import Kind
from podnet.store.base import Compacted, StoreUnavailable, WatchEvent

log = logging.getLogger("podnet.controllers")

Obj = dict[str, Any]
T = TypeVar("T")

SYNC, SYNCED, RESYNC = "SYNC", "SYNCED", "RESYNC"
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
CALL_TIMEOUT = 10.0  # one API call
RETRY_DEADLINE = 60.0  # retries of one call, in all


# ---- errors and retries -------------------------------------------------------------------


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: the store or the server was briefly unavailable."""
    if isinstance(exc, StoreUnavailable | TimeoutError | ConnectionError):
        return True
    return isinstance(exc, ApiError) and exc.code in (429, 503, 504)


def is_reason(exc: BaseException, *reasons: str) -> bool:
    """Whether ``exc`` is an ``ApiError`` with one of ``reasons`` (``NotFound``, ``Conflict``)."""
    return isinstance(exc, ApiError) and exc.reason in reasons


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``initial * factor**attempt``, capped, times a
    random factor from ``floor`` to 1 (``floor=0`` is "full jitter")."""

    initial: float = 0.05
    cap: float = 5.0
    factor: float = 2.0
    floor: float = 0.5

    def delay(self, attempt: int) -> float:
        base = min(self.cap, self.initial * self.factor ** min(attempt, 32))
        return base * random.uniform(self.floor, 1.0)


# An etcd watch is retried at least once a second (full jitter): the controllers see
# changes again within ~1 s of etcd coming back.
WATCH_BACKOFF = Backoff(0.2, 1.0, floor=0.0)


async def call_with_retry(
    call: Callable[[], Awaitable[T]],
    what: str,
    timeout: float = CALL_TIMEOUT,
    deadline: float = RETRY_DEADLINE,
    backoff: Backoff = Backoff(),
) -> T:
    """Run ``call`` with a timeout; retry transient failures with backoff until ``deadline``."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline
    attempt = 0
    while True:
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            async with asyncio.timeout(timeout):
                return await call()
        except Exception as exc:
            delay = backoff.delay(attempt)
            if not is_transient(exc) or loop.time() + delay > give_up:
                raise
            log.warning("%s failed (%s); retrying in %.2fs", what, exc or type(exc).__name__, delay)
            await asyncio.sleep(delay)
            attempt += 1


async def get_or_none(
    registry: Registry, kind: Kind, name: str, namespace: str | None = None
) -> Obj | None:
    """A fresh read of one object (with retries), or None when it does not exist."""
    try:
        return await call_with_retry(
            lambda: registry.get(kind, namespace, name), f"get {kind.singular} {name}"
        )
    except ApiError as exc:
        if exc.reason == "NotFound":
            return None
        raise


# ---- the object stream --------------------------------------------------------------------


def marker(revision: int) -> Obj:
    """The object carried by ``SYNCED`` and ``RESYNC``: just a resourceVersion."""
    return {"metadata": {"resourceVersion": str(revision)}}


def resource_version(obj: Obj) -> int:
    """The object's resourceVersion as an int (0 when it has none)."""
    return int((obj.get("metadata") or {}).get("resourceVersion") or 0)


async def watch_objects(
    registry: Registry, kind: Kind, resync_period: float | None = None
) -> AsyncIterator[tuple[str, Obj]]:
    """Every object of ``kind`` (``SYNC`` ... ``SYNCED``), then its changes, for ever."""
    async for item in _Reflector(registry, kind, resync_period).run():
        yield item


class _Reflector:
    def __init__(self, registry: Registry, kind: Kind, resync_period: float | None) -> None:
        self.registry = registry
        self.kind = kind
        self.period = resync_period
        self.known: dict[str, int] = {}  # key -> resourceVersion last emitted
        self.revision = 0

    async def run(self) -> AsyncIterator[tuple[str, Obj]]:
        first = True
        while True:
            items, self.revision = await call_with_retry(
                lambda: self.registry.list(self.kind), f"list {self.kind.plural}"
            )
            if not first:
                yield RESYNC, marker(self.revision)
            for item in self._relist(items):
                yield item
            yield SYNCED, marker(self.revision)
            first = False
            async for item in self._follow():
                yield item

    def _relist(self, items: list[Obj]) -> list[tuple[str, Obj]]:
        events: list[tuple[str, Obj]] = []
        current: dict[str, int] = {}
        for obj in items:
            meta = obj["metadata"]
            current[self.registry.key(self.kind, meta.get("namespace"), meta["name"])] = (
                resource_version(obj)
            )
            events.append((SYNC, obj))
        for key in self.known.keys() - current.keys():
            events.append((DELETED, self._tombstone(key, self.revision)))
        self.known = current
        return events

    def _tombstone(self, key: str, revision: int) -> Obj:
        parsed = self.registry.parse_key(key)
        meta: Obj = {"name": parsed[2] if parsed else key.rsplit("/", 1)[-1]}
        if parsed and parsed[1]:
            meta["namespace"] = parsed[1]
        meta["resourceVersion"] = str(revision)
        return {"apiVersion": self.kind.api_version, "kind": self.kind.kind, "metadata": meta}

    async def _follow(self) -> AsyncIterator[tuple[str, Obj]]:
        """Watch from ``self.revision`` until a relist is due (compaction or resync time)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.period if self.period else None
        attempt = 0
        prefix = self.registry.kind_prefix(self.kind)
        while until is None or loop.time() < until:
            try:
                stream = self.registry.store.watch(prefix, self.revision)
                async for event in _bounded(stream, until):
                    attempt = 0
                    item = self._convert(event)
                    if item is not None:
                        yield item
            except Compacted as exc:
                log.info("watch of %s fell behind (%s); relisting", self.kind.plural, exc)
                return
            except StoreUnavailable as exc:
                delay = WATCH_BACKOFF.delay(attempt)
                what = self.kind.plural
                log.warning("watch of %s failed (%s); retrying in %.2fs", what, exc, delay)
                await asyncio.sleep(delay)
                attempt += 1

    def _convert(self, event: WatchEvent) -> tuple[str, Obj] | None:
        self.revision = max(self.revision, event.revision)
        parsed = self.registry.parse_key(event.key)
        if parsed is None or parsed[0] != self.kind:
            return None
        if event.type == "DELETE":
            self.known.pop(event.key, None)
            obj = self._decode(event) if event.value else None
            obj = obj or self._tombstone(event.key, event.revision)
            obj["metadata"]["resourceVersion"] = str(event.revision)
            return DELETED, obj
        obj = self._decode(event)
        if obj is None:
            return None
        change = MODIFIED if event.key in self.known else ADDED
        self.known[event.key] = event.revision
        return change, obj

    def _decode(self, event: WatchEvent) -> Obj | None:
        try:
            return self.registry.decode_bytes(event.value, event.revision)
        except ValueError:
            log.warning("skipping undecodable value at %s", event.key)
            return None


async def _bounded(
    stream: AsyncIterator[WatchEvent], until: float | None
) -> AsyncIterator[WatchEvent]:
    """The events of ``stream`` until the loop time ``until`` (if given); closes ``stream``."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            timeout = None if until is None else max(0.0, until - loop.time())
            try:
                async with asyncio.timeout(timeout):
                    event = await anext(stream)
            except (TimeoutError, StopAsyncIteration):
                return
            yield event
    finally:
        closer = getattr(stream, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()


async def consume_until_synced(
    stream: AsyncIterator[tuple[str, Obj]], handle: Callable[[str, Obj], None]
) -> int:
    """Feed ``stream`` to ``handle`` up to and including the first ``SYNCED``; count objects."""
    count = 0
    async for change, obj in stream:
        handle(change, obj)
        if change == SYNCED:
            return count
        count += change == SYNC
    return count


async def pump(stream: AsyncIterator[tuple[str, Obj]], handle: Callable[[str, Obj], None]) -> None:
    """Feed ``stream`` to ``handle`` for ever."""
    async for change, obj in stream:
        handle(change, obj)


# ---- cache --------------------------------------------------------------------------------


class ObjectCache:
    """The newest known version of each object, by name; older versions are ignored.

    Both the watch and the controller's own writes feed it, in any order: a version older
    than the one held (or than a deletion seen) is dropped, so the cache never goes back.
    """

    def __init__(self) -> None:
        self._objects: dict[str, Obj] = {}
        self._deleted: dict[str, int] = {}  # name -> revision of its deletion

    def get(self, name: str) -> Obj | None:
        """The newest known version of ``name``, or None."""
        return self._objects.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._objects

    def __len__(self) -> int:
        return len(self._objects)

    def names(self) -> list[str]:
        return list(self._objects)

    def values(self) -> list[Obj]:
        return list(self._objects.values())

    def put(self, obj: Obj) -> tuple[bool, Obj | None]:
        """Store ``obj`` unless it is stale: (whether it was stored, the version it replaced)."""
        name = obj["metadata"]["name"]
        revision = resource_version(obj)
        current = self._objects.get(name)
        if current is not None and resource_version(current) >= revision:
            return False, current
        if self._deleted.get(name, 0) >= revision:
            return False, None
        self._objects[name] = obj
        self._deleted.pop(name, None)
        return True, current

    def remove(self, name: str, revision: int) -> Obj | None:
        """Forget ``name`` as deleted at ``revision``; the removed object, or None."""
        current = self._objects.get(name)
        if current is not None and resource_version(current) > revision:
            return None
        self._deleted[name] = max(revision, self._deleted.get(name, 0))
        return self._objects.pop(name, None)

    def forget_deletions(self, upto: int) -> None:
        """Drop deletion records at or before ``upto`` (a full listing has superseded them)."""
        self._deleted = {n: r for n, r in self._deleted.items() if r > upto}
