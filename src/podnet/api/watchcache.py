"""One etcd watch for the whole registry: the current objects, recent changes, fan-out.

The master lists the registry prefix once, then opens a single watch on it, as
kube-apiserver's watch cache does. From that it keeps

- the current objects of every kind as stored bytes (``podnet.api.cachedobjects``), so
  lists are answered without etcd (``podnet.api.listing`` says when);
- the most recent events in a ring buffer, each decoded once;
- the watchers (``podnet.api.fanout``), each a position in that ring: an event is encoded
  once and written to every watcher whose filter selects it.

A watcher that asks for a revision older than the ring, falls behind it, or whose replay
or backlog grows over the limit is told 410 Gone and relists, as with kube-apiserver's
watch cache (``podnet.api.replay``). ``direct_events`` serves the in-process controllers.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from operator import attrgetter

from podnet.api import storedform
from podnet.api.cachedobjects import (
    CachedEvent,
    CachedObject,
    KeyedView,
    KindObjects,
    WatchFilter,
)
from podnet.api.fanout import BACKLOG_LIMIT, Fanout, Sink, Watcher, pinned_name
from podnet.api.followers import Followers, woken
from podnet.api.podaddresses import PodAddresses
from podnet.api.registry import Registry
from podnet.api.storeevents import direct_events, to_cached
from podnet.model import errors
from podnet.model.kinds import POD, Kind
from podnet.model.selectors import FieldRequirement, LabelSelector
from podnet.store.base import Compacted, KeyValue, WatchEvent

__all__ = ["BOOKMARK_EVERY", "CachedEvent", "WatchCache", "WatchFilter", "direct_events"]
log = logging.getLogger(__name__)
BOOKMARK_EVERY = 10.0  # seconds of silence before a single watcher's stream bookmarks
# Fan-out watchers get a BOOKMARK every BOOKMARK_PERIOD s, dealt out over BOOKMARK_TURNS
# rounds (10,000 writes at once stalled the loop); well inside HISTORY, so a watcher
# reconnecting from its last bookmark is still in the ring.
BOOKMARK_PERIOD = 30.0
BOOKMARK_TURNS = 30
# The ring keeps CAPACITY events, and beyond that every event younger than HISTORY seconds
# (kube-apiserver's watch cache keeps 75 s): 5,000 nodes renewing Leases write 500 events a
# second, which would push pod events out of 20,000 slots in 40 s. MAX_EVENTS bounds it.
CAPACITY = 20_000
HISTORY = 75.0
MAX_EVENTS = 200_000
# From COALESCE_FROM watchers, changes within the coalescing window of the last dispatch
# wait for the next: several events per write. The window grows with the watchers (a
# round costs a TLS write and a send each) from COALESCE up to COALESCE_MAX.
COALESCE = 0.1
COALESCE_FROM = 500
COALESCE_PER_WATCHER = 25e-6
COALESCE_MAX = 0.25


class WatchCache:
    """The registry's current objects, its recent events and the watchers served from them."""

    def __init__(
        self,
        registry: Registry,
        capacity: int = CAPACITY,
        history: float = HISTORY,
        backlog_limit: int = BACKLOG_LIMIT,
        coalesce: float = COALESCE,
        coalesce_from: int = COALESCE_FROM,
        observe: Callable[[float], None] | None = None,
        bookmark_period: float = BOOKMARK_PERIOD,
    ) -> None:
        self.registry = registry
        self.bookmark_period = bookmark_period
        self.capacity = capacity
        self.history = history
        self.fanout = Fanout(backlog_limit)
        self.coalesce = coalesce
        self.coalesce_from = coalesce_from
        self._observe = observe  # seconds from a change's arrival to its dispatch
        self._last_dispatch = 0.0
        self._dispatched = 0  # absolute index of the first event not dispatched yet
        self._objects: dict[Kind, KindObjects] = {}
        self.pod_addresses = PodAddresses()  # podnet.api.admission's address check
        self._events: list[CachedEvent] = []
        self._offset = 0  # absolute index of self._events[0]
        self._start_revision = 0  # changes after this revision are all in the buffer
        self._latest_revision = 0
        self._wakeup: asyncio.Future[None] | None = None
        self._followers = Followers()  # per-kind wakeups of the in-process followers
        self._dispatch_due = False
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = asyncio.Event()

    @property
    def latest_revision(self) -> int:
        return self._latest_revision

    # ---- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._wakeup = asyncio.get_running_loop().create_future()
        revision = await self._load()
        self._tasks.append(asyncio.create_task(self._run(revision), name="watch-cache"))
        self._tasks.append(asyncio.create_task(self._bookmarks(), name="watch-bookmarks"))
        self.ready.set()

    async def stop(self) -> None:
        self.fanout.close_all()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _load(self) -> int:
        """Read every object at one revision; start the ring empty at that revision."""
        kvs, revision = await self.registry.store.list(self.registry.prefix)
        objects: dict[Kind, KindObjects] = {}
        self.pod_addresses = PodAddresses()
        for kv in kvs:
            self._load_one(objects, kv)
        self._objects = objects
        self._offset += len(self._events)
        self._followers.dropped(self._events)
        self._events.clear()
        self._followers.wake_all()
        self._start_revision = self._latest_revision = revision
        self._notify()
        self._schedule()  # watchers behind the new ring are told 410
        return revision

    def _load_one(self, objects: dict[Kind, KindObjects], kv: KeyValue) -> None:
        parsed = self.registry.parse_key(kv.key)
        if parsed is None:
            return
        kind, key = parsed[0], self._relative(kv.key, parsed[0])
        obj = storedform.decode(kv.value, 0)
        cached = CachedObject(
            storedform.splice(kv.value, kv.mod_revision),
            kv.mod_revision,
            storedform.probe(kind, obj),
        )
        objects.setdefault(kind, KindObjects()).put(key, cached)
        if kind == POD:
            self.pod_addresses.put(key, obj)

    def _relative(self, key: str, kind: Kind) -> str:
        return key[len(self.registry.kind_prefix(kind)) :]

    async def _run(self, revision: int) -> None:
        while True:
            try:
                async for event in self.registry.store.watch(self.registry.prefix, revision):
                    revision = event.revision
                    self._apply(event)
            except asyncio.CancelledError:
                raise
            except Compacted:
                log.error("watch cache fell behind compaction; relisting")
                revision = await self._load()
            except Exception as exc:  # the store went away: retry, keep serving the cache
                log.warning("registry watch failed (%s); retrying", exc)
                await asyncio.sleep(0.5)

    def _apply(self, event: WatchEvent) -> None:
        """One store change: into the current objects, the ring and the fan-out."""
        parsed = self.registry.parse_key(event.key)
        if parsed is not None:
            kind = parsed[0]
            objects = self._objects.setdefault(kind, KindObjects())
            key = self._relative(event.key, kind)
            before = objects.items.get(key)
            pod = None  # a pod's new value, decoded once for its probe and its addresses
            if kind == POD and event.type != "DELETE":
                pod = storedform.decode(event.value, 0)
            cached = to_cached(self.registry, event, before.probe if before else None, pod)
            assert cached is not None
            if event.type == "DELETE":
                objects.delete(key)
                self.pod_addresses.remove(key)
            else:
                wire = storedform.splice(event.value, event.revision)
                objects.put(key, CachedObject(wire, event.revision, cached.probe))
                if pod is not None:
                    self.pod_addresses.put(key, pod)
            self._append(cached)
            self._followers.changed(kind)
        self._latest_revision = max(self._latest_revision, event.revision)
        self._notify()

    def _append(self, event: CachedEvent) -> None:
        event.arrived = asyncio.get_running_loop().time()
        self._events.append(event)
        beyond = len(self._events) - self.capacity
        if beyond > 0 and self._events[0].arrived < event.arrived - self.history:
            cutoff = event.arrived - self.history
            drop = bisect.bisect_left(self._events, cutoff, hi=beyond, key=attrgetter("arrived"))
            self._drop_oldest(max(drop, len(self._events) - MAX_EVENTS))
        elif len(self._events) > MAX_EVENTS:
            self._drop_oldest(len(self._events) - MAX_EVENTS)
        self._schedule()

    def _drop_oldest(self, drop: int) -> None:
        if drop > 0:
            self._start_revision = self._events[drop - 1].revision
            self._followers.dropped(self._events[:drop])
            del self._events[:drop]
            self._offset += drop

    def _schedule(self) -> None:
        """Dispatch soon: events that arrive meanwhile go out in the same writes."""
        if self._dispatch_due:
            return
        self._dispatch_due = True
        loop = asyncio.get_running_loop()
        window = coalescing_window(len(self.fanout), self.coalesce, self.coalesce_from)
        delay = self._last_dispatch + window - loop.time()
        if delay > 0:
            loop.call_later(delay, self._dispatch)
        else:
            loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_due = False
        self.fanout.dispatch(self._events, self._offset)
        now = self._last_dispatch = asyncio.get_running_loop().time()
        first = max(self._dispatched, self._offset) - self._offset
        if self._observe is not None and first < len(self._events):
            self._observe(now - self._events[first].arrived)
        self._dispatched = self._offset + len(self._events)

    def _notify(self) -> None:
        wakeup, self._wakeup = self._wakeup, asyncio.get_running_loop().create_future()
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _bookmarks(self) -> None:
        turn = 0
        while True:
            await asyncio.sleep(self.bookmark_period / BOOKMARK_TURNS)
            self._bookmark(turn)
            turn = (turn + 1) % BOOKMARK_TURNS

    def _bookmark(self, turn: int) -> None:
        """BOOKMARKs at the last dispatched revision, which every grouped watcher has had
        (at the latest one, under steady Lease renewals, no round ever went out)."""
        end = self._dispatched
        if end < self._offset:  # undispatched events left the ring: the next dispatch drops
            return
        at = end - self._offset - 1
        revision = self._events[at].revision if at >= 0 else self._start_revision
        self.fanout.bookmark(revision, end, turn, BOOKMARK_TURNS)

    def forget_before(self, revision: int) -> None:
        """Drop buffered events at or before ``revision`` (after a compaction)."""
        if revision <= self._start_revision:
            return
        cut = bisect.bisect_right(self._events, revision, key=_revision_of)
        self._followers.dropped(self._events[:cut])
        del self._events[:cut]
        self._offset += cut
        self._start_revision = revision

    # ---- reads ------------------------------------------------------------------------

    def objects(
        self,
        kind: Kind,
        namespace: str | None = None,
        labels: LabelSelector | None = None,
        fields: Sequence[FieldRequirement] = (),
    ) -> tuple[Sequence[tuple[str, CachedObject]], int]:
        """(key, object) of ``kind`` in key order that match, and the cache's revision.

        No etcd read: the revision may trail etcd's by the watch's delay (``wait_for``
        a revision first to read at least that). ``CachedObject.obj`` decodes one.
        """
        kind_objects = self._objects.get(kind)
        if kind_objects is None:
            return [], self._latest_revision
        keys = kind_objects.sorted_keys()
        if kind.namespaced and namespace:
            first = namespace + "/"
            keys = keys[bisect.bisect_left(keys, first) : bisect.bisect_left(keys, first + "\xff")]
        items = kind_objects.items
        if labels is None and not fields:
            return KeyedView(keys, items), self._latest_revision
        wf = WatchFilter(kind, namespace, labels, fields)
        name = pinned_name(wf)
        if name is not None and (namespace or not kind.namespaced):
            # fieldSelector=metadata.name=<name> names one key: no scan of the kind.
            key = f"{namespace}/{name}" if kind.namespaced else name
            keys = [key] if key in items else []
        selected = [(key, items[key]) for key in keys if wf.selects(items[key].probe)]
        return selected, self._latest_revision

    def namespaces(self, kind: Kind) -> tuple[set[str], int]:
        """The namespaces holding an object of the namespaced ``kind`` (from its keys,
        nothing decoded), and the cache's revision."""
        kind_objects = self._objects.get(kind)
        found = kind_objects.namespaces() if kind_objects is not None else set()
        return found, self._latest_revision

    def current(self, kind: Kind, namespace: str | None, name: str) -> CachedObject | None:
        """The cached object of that name, if any (it may trail etcd, as ``objects``)."""
        kind_objects = self._objects.get(kind)
        if kind_objects is None:
            return None
        return kind_objects.items.get(f"{namespace}/{name}" if kind.namespaced else name)

    def everything(self, kind: Kind) -> tuple[bytes, int, int]:
        """(the JSON of every object of ``kind`` comma-separated, how many, revision)."""
        kind_objects = self._objects.get(kind)
        if kind_objects is None:
            return b"", 0, self._latest_revision
        return kind_objects.joined(), len(kind_objects.items), self._latest_revision

    async def wait_for(self, revision: int, timeout: float) -> bool:
        """Wait until the cache has seen ``revision``; False if ``timeout`` passed first."""
        try:
            async with asyncio.timeout(timeout):
                while self._latest_revision < revision:
                    assert self._wakeup is not None
                    await asyncio.shield(self._wakeup)
        except TimeoutError:
            return False
        return True

    def covers(self, revision: int) -> bool:
        """Whether every change after ``revision`` is in the buffer."""
        return revision >= self._start_revision

    def position_after(self, revision: int) -> int:
        """The absolute index of the first buffered event after ``revision`` (O(log n))."""
        return self._offset + bisect.bisect_right(self._events, revision, key=_revision_of)

    def ring(self) -> tuple[int, Sequence[CachedEvent]]:
        """(absolute index of the oldest buffered event, the buffer): valid until an await."""
        return self._offset, self._events

    def watch(self, wf: WatchFilter, sink: Sink, after: int, bookmarks: bool) -> Watcher:
        """Serve a watcher from the fan-out after revision ``after`` (stop it with
        ``unwatch``; its ``done`` future says why it ended: an ApiError to relist)."""
        watcher = Watcher(wf, sink, self.position_after(after), bookmarks)
        if not self.covers(after):
            watcher.finish(errors.gone(f"too old resource version: {after}"))
            return watcher
        self.fanout.add(watcher)
        if watcher.position < self._offset + len(self._events):
            self._schedule()
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.fanout.remove(watcher)

    async def follow(
        self, after_revision: int, bookmark_every: float | None = None, kind: Kind | None = None
    ) -> AsyncIterator[CachedEvent | int]:
        """Events after ``after_revision``, then live; an int is a bookmark revision.
        With ``kind``, only that kind's events, and only they wake the follower
        (``podnet.api.followers``)."""
        if not self.covers(after_revision):
            raise errors.gone(f"too old resource version: {after_revision}")
        position, seen = self.position_after(after_revision), after_revision
        while True:
            while True:  # the ring may move on while the consumer holds an event
                if position < self._offset:
                    if kind is None or self._followers.missed(kind, seen):
                        raise errors.gone("too old resource version: the watcher fell behind")
                    position = self._offset  # only other kinds' changes were dropped
                if position - self._offset >= len(self._events):
                    break
                event = self._events[position - self._offset]
                position, seen = position + 1, event.revision
                if kind is None or event.kind is kind:
                    yield event
            wakeup = self._wakeup if kind is None else self._followers.wakeup(kind)
            assert wakeup is not None
            if not await woken(wakeup, bookmark_every):
                yield self._latest_revision


def coalescing_window(watchers: int, base: float, since: int) -> float:
    """Seconds after a dispatch during which new changes wait for the next one."""
    if watchers < since:
        return 0.0
    return max(base, min(COALESCE_MAX, watchers * COALESCE_PER_WATCHER))


def _revision_of(event: CachedEvent) -> int:
    return event.revision
