"""One shared watch per kind for every consumer in a process (client-go's informers).

The node agent's remote-node sync, policy sync, service proxy and cluster DNS each want
"every object, then every change" of some kinds, and several want the same kind
(HostSubnets three times, Pods, Services and EndpointSlices twice). ``Informers`` runs
one reflector (``podnet.client.reflector``) per (kind, namespace) and hands its events to
every subscriber, so the master sends each event once per process and the objects are
decoded once:

- ``watch(kind)`` has the signature and stream of ``Reflectors.watch``: ``LISTED`` first,
  then ``ADDED``/``MODIFIED``/``DELETED``, and after a relist (410 Expired, resync) the
  reflector's tombstones and a new ``LISTED``, which reach every subscriber.
- A subscriber that joins after the shared listing was delivered gets a reflector of its
  own (its own list + watch). The hub keeps no objects: a late joiner would need them,
  and keeping every object in full (150,000 Pods) for that costs far more than one more
  watch. The agent subscribes every consumer before the first listing arrives, so this
  is the exception (``started`` counts the reflectors).
- Each subscriber has its own unbounded queue: a slow one falls behind and loses
  nothing, and never holds up the others.
- A permanent error of the reflector (403, 404) is raised to every subscriber; the
  shared watch is gone, and the next subscriber starts a new one with a new listing.
  When the last subscriber leaves, the shared watch is closed.
- ``has_listed(kind)``: whether the kind's first listing has arrived.

Consumers slim what they keep themselves; the hub holds no objects, only queued events.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field

from podnet.client.backoff import WATCH_BACKOFF, Backoff
from podnet.client.objectapi import ListWatch
from podnet.client.reflector import reflect
from podnet.client.watch import LISTED, ResourceVersion, WatchEvent
from podnet.model.kinds import Kind

Source = Callable[[], AsyncIterator[WatchEvent]]  # a reflector's stream, started on call
Item = WatchEvent | BaseException | None  # what a subscriber's queue holds (None: the end)
SharedKey = tuple[str, str | None]  # (kind plural, namespace or None for all)


@dataclass(eq=False)
class Fanout:
    """The bookkeeping of one shared stream, without I/O: whether it has listed, the
    version, and one queue per subscriber."""

    version: ResourceVersion = 0
    listed: bool = False
    queues: list[asyncio.Queue[Item]] = field(default_factory=list)

    def subscribe(self) -> asyncio.Queue[Item]:
        """A new subscriber's queue, which receives every event from the listing on;
        only before the listing (a later one needs a stream of its own)."""
        if self.listed:
            raise RuntimeError("the shared stream has listed: a late subscriber needs its own")
        queue: asyncio.Queue[Item] = asyncio.Queue()
        self.queues.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Item]) -> None:
        """Stop queueing for ``queue`` (no-op when it is not subscribed)."""
        with contextlib.suppress(ValueError):
            self.queues.remove(queue)

    def publish(self, event: WatchEvent) -> None:
        """Queue ``event`` for every subscriber."""
        self.version = max(self.version, event.resource_version)
        self.listed = self.listed or event.type == LISTED
        for queue in self.queues:
            queue.put_nowait(event)

    def fail(self, exc: BaseException | None) -> None:
        """Hand ``exc`` to every subscriber: each raises it after the events before it
        (``None``: each stream ends there)."""
        for queue in self.queues:
            queue.put_nowait(exc)
        self.queues = []


@dataclass(eq=False)
class _Shared:
    """One running reflector and its fanout."""

    fanout: Fanout
    pump: asyncio.Task[None] | None = None


class Informers:
    """Shared reflectors by (kind, namespace) over one ``ListWatch``."""

    def __init__(
        self,
        api: ListWatch,
        resync_period: float | None = None,
        backoff: Backoff = WATCH_BACKOFF,
    ) -> None:
        self.api = api
        self.resync_period = resync_period
        self.backoff = backoff
        self._shared: dict[SharedKey, _Shared] = {}
        self.started = 0  # reflectors started (each one list + watch on the server)

    def has_listed(self, kind: Kind, namespace: str | None = None) -> bool:
        """Whether the shared watch of ``kind`` has delivered its first listing."""
        shared = self._shared.get((kind.plural, namespace))
        return shared is not None and shared.fanout.listed

    def subscribers(self, kind: Kind, namespace: str | None = None) -> int:
        """How many consumers share the watch of ``kind`` now."""
        shared = self._shared.get((kind.plural, namespace))
        return len(shared.fanout.queues) if shared is not None else 0

    async def watch(
        self, kind: Kind, namespace: str | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        """``LISTED``, then every change of ``kind`` (in ``namespace``, or all), for ever."""
        key = (kind.plural, namespace)
        shared = self._shared.get(key)
        if shared is not None and shared.fanout.listed:  # late: a reflector of its own
            self.started += 1
            async for event in self._source(kind, namespace)():
                yield event
            return
        if shared is None:
            shared = self._shared[key] = _Shared(Fanout())
            source = self._source(kind, namespace)
            shared.pump = asyncio.create_task(self._pump(key, shared, source), name=kind.plural)
            self.started += 1
        queue = shared.fanout.subscribe()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._leave(key, shared, queue)

    def _source(self, kind: Kind, namespace: str | None) -> Source:
        return lambda: reflect(self.api, kind, namespace, self.resync_period, self.backoff)

    async def _pump(self, key: SharedKey, shared: _Shared, source: Source) -> None:
        """Read the reflector into the fanout; on its failure, fail every subscriber."""
        failure: Exception | None = None
        try:
            async for event in source():
                shared.fanout.publish(event)
        except Exception as exc:
            failure = exc
        self._forget(key, shared)
        shared.fanout.fail(failure)

    def _leave(self, key: SharedKey, shared: _Shared, queue: asyncio.Queue[Item]) -> None:
        shared.fanout.unsubscribe(queue)
        if not shared.fanout.queues:
            self._forget(key, shared)
            if shared.pump is not None:
                shared.pump.cancel()

    def _forget(self, key: SharedKey, shared: _Shared) -> None:
        if self._shared.get(key) is shared:
            del self._shared[key]

    async def close(self) -> None:
        """Stop every shared watch; the subscribers' streams end."""
        shared, self._shared = list(self._shared.values()), {}
        pumps = [s.pump for s in shared if s.pump is not None]
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for one in shared:
            one.fanout.fail(None)
