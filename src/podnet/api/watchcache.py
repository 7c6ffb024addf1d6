"""One etcd watch for the whole registry, fanned out to every API watcher.

The master opens a single watch on the registry prefix and keeps the most recent events
in a ring buffer, each decoded once. An API watcher is a cursor into that buffer: it
filters by kind, namespace and selectors, and waits on a shared future when it has caught
up, so a write reaches 200 watchers with one decode and no per-watcher etcd stream. A
watcher that asks for a revision older than the buffer is served by its own etcd watch
(and gets 410 Gone if etcd has compacted it); one that falls behind the buffer is told
410 too, and relists, as kube-apiserver's watch cache does.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from podnet.api.objects import matches
from podnet.api.registry import Obj, Registry
from podnet.model import errors
from podnet.model.kinds import Kind
from podnet.model.selectors import FieldRequirement, LabelSelector
from podnet.store.base import Compacted, WatchEvent

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CachedEvent:
    """A registry change, decoded once and shared by every watcher."""

    revision: int
    kind: Kind
    namespace: str | None
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    prev: Obj | None
    rendered: dict[str, bytes] = field(default_factory=dict)  # per output format


@dataclass(frozen=True)
class WatchFilter:
    kind: Kind
    namespace: str | None = None
    labels: LabelSelector | None = None
    fields: Sequence[FieldRequirement] = ()

    def selects(self, obj: Obj | None) -> bool:
        return obj is not None and matches(obj, self.labels, self.fields)

    def view(self, event: CachedEvent) -> str | None:
        """The event type this watcher sees, or None (kube's filtered-watch rules)."""
        if event.kind is not self.kind:
            return None
        if self.namespace and event.namespace != self.namespace:
            return None
        now, before = self.selects(event.obj), self.selects(event.prev)
        if event.type == "DELETED":
            return "DELETED" if before or now else None
        if now and before:
            return "MODIFIED"
        if now:
            return "ADDED"
        return "DELETED" if before else None


def to_cached(registry: Registry, event: WatchEvent) -> CachedEvent | None:
    """Decode a store event into an API event, or None for non-object keys."""
    parsed = registry.parse_key(event.key)
    if parsed is None:
        return None
    kind, namespace, _ = parsed
    prev = None
    if event.prev_value:
        prev = Registry.decode_bytes(event.prev_value, event.revision)
    if event.type == "DELETE":
        obj = prev if prev is not None else {"metadata": {"name": parsed[2]}}
        obj["metadata"]["resourceVersion"] = str(event.revision)
        return CachedEvent(event.revision, kind, namespace, "DELETED", obj, prev)
    obj = Registry.decode_bytes(event.value, event.revision)
    kind_of_change = "ADDED" if event.create_revision == event.revision else "MODIFIED"
    return CachedEvent(event.revision, kind, namespace, kind_of_change, obj, prev)


class WatchCache:
    """Ring buffer of recent registry events plus the live tail."""

    def __init__(self, registry: Registry, capacity: int = 20000) -> None:
        self.registry = registry
        self.capacity = capacity
        self._events: list[CachedEvent] = []
        self._offset = 0  # absolute index of self._events[0]
        self._start_revision = 0  # changes after this revision are all in the buffer
        self._latest_revision = 0
        self._wakeup: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    @property
    def latest_revision(self) -> int:
        return self._latest_revision

    async def start(self) -> None:
        revision = await self.registry.store.revision()
        self._start_revision = self._latest_revision = revision
        self._wakeup = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(revision), name="watch-cache")
        self.ready.set()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self, revision: int) -> None:
        while True:
            try:
                async for event in self.registry.store.watch(self.registry.prefix, revision):
                    revision = event.revision
                    cached = to_cached(self.registry, event)
                    if cached is not None:
                        self._append(cached)
                    self._latest_revision = max(self._latest_revision, revision)
            except asyncio.CancelledError:
                raise
            except Compacted:
                log.error("watch cache fell behind compaction; restarting from now")
                revision = await self.registry.store.revision()
                self._reset(revision)
            except Exception as exc:  # the store went away: retry, keep serving the buffer
                log.warning("registry watch failed (%s); retrying", exc)
                await asyncio.sleep(0.5)

    def _reset(self, revision: int) -> None:
        self._offset += len(self._events)
        self._events.clear()
        self._start_revision = self._latest_revision = revision
        self._notify()

    def _append(self, event: CachedEvent) -> None:
        self._events.append(event)
        if len(self._events) > self.capacity:
            drop = len(self._events) - self.capacity
            self._start_revision = self._events[drop - 1].revision
            del self._events[:drop]
            self._offset += drop
        self._notify()

    def _notify(self) -> None:
        wakeup, self._wakeup = self._wakeup, asyncio.get_running_loop().create_future()
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def forget_before(self, revision: int) -> None:
        """Drop buffered events at or before ``revision`` (after a compaction)."""
        if revision <= self._start_revision:
            return
        cut = bisect.bisect_right([e.revision for e in self._events], revision)
        del self._events[:cut]
        self._offset += cut
        self._start_revision = revision

    def covers(self, revision: int) -> bool:
        """Whether every change after ``revision`` is in the buffer."""
        return revision >= self._start_revision

    def _position_after(self, revision: int) -> int:
        revisions = [e.revision for e in self._events]
        return self._offset + bisect.bisect_right(revisions, revision)

    async def follow(
        self, after_revision: int, bookmark_every: float | None = None
    ) -> AsyncIterator[CachedEvent | int]:
        """Events after ``after_revision``, then live; an int is a bookmark revision."""
        position = self._position_after(after_revision)
        while True:
            if position < self._offset:
                raise errors.gone("too old resource version: the watcher fell behind")
            while position - self._offset < len(self._events):
                event = self._events[position - self._offset]
                position += 1
                yield event
            assert self._wakeup is not None
            try:
                await asyncio.wait_for(asyncio.shield(self._wakeup), bookmark_every)
            except TimeoutError:
                yield self._latest_revision


async def direct_events(
    registry: Registry, after_revision: int
) -> AsyncIterator[CachedEvent | int]:
    """Events straight from the store, for a revision older than the cache's window."""
    try:
        async for event in registry.store.watch(registry.prefix, after_revision):
            cached = to_cached(registry, event)
            if cached is not None:
                yield cached
    except Compacted as exc:
        raise errors.gone(f"too old resource version: {after_revision} ({exc})") from exc


def event_object(event: CachedEvent) -> dict[str, Any]:
    return {"type": event.type, "object": event.obj}
