"""List + watch over any ``ObjectApi``, as one endless stream of events (client-go's
reflector).

``reflect(api, kind)`` yields ``LISTED`` (every object, and the listing's resourceVersion)
and then the watch's ``ADDED``, ``MODIFIED`` and ``DELETED`` events, for ever:

- the watch resumes from the last resourceVersion seen (bookmarks included) when it ends
  or fails with a transient error, after the shared jittered backoff;
- when the watch answers ``Expired`` (410: the resourceVersion is compacted away), or when
  the optional resync period ends, it lists again: a ``DELETED`` for every object that
  vanished between the two listings (its resourceVersion is the new listing's), then
  a fresh ``LISTED``;
- a listing is retried for ever on transient errors; a permanent error (403, 404) of
  the listing or the watch is raised to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from podnet.client.backoff import WATCH_BACKOFF, Attempts, Backoff, with_retry
from podnet.client.errors import Expired, is_transient, one_line
from podnet.client.objectapi import Listing, ListWatch, ObjectApi
from podnet.client.paths import metadata, object_key
from podnet.client.watch import (
    BOOKMARK,
    DELETED,
    MODIFIED,
    Obj,
    ResourceVersion,
    WatchEvent,
    listed,
    parse_version,
)
from podnet.model.kinds import Kind

log = logging.getLogger("podnet.client.reflector")

Key = tuple[str, str]  # (namespace, name)


def reflect(
    api: ListWatch,
    kind: Kind,
    namespace: str | None = None,
    resync_period: float | None = None,
    backoff: Backoff = WATCH_BACKOFF,
) -> AsyncIterator[WatchEvent]:
    """``LISTED``, then every change of ``kind`` (in ``namespace``, or all), for ever."""
    return Reflector(api, kind, namespace, resync_period, backoff).events()


@dataclass
class Reflector:
    """One kind's listing and watch; ``events()`` runs it."""

    api: ListWatch
    kind: Kind
    namespace: str | None = None
    resync_period: float | None = None
    backoff: Backoff = WATCH_BACKOFF
    version: ResourceVersion = field(default=0, init=False)
    known: set[Key] = field(default_factory=set, init=False)  # what the consumer holds

    async def events(self) -> AsyncIterator[WatchEvent]:
        """The stream described in the module docstring."""
        while True:
            listing = await with_retry(
                lambda: self.api.list(self.kind, self.namespace),
                f"list {self.kind.plural}",
                None,
                self.backoff,
            )
            for event in self.relist(listing):
                yield event
            # Watch from the listing until a relist is due (410, or the resync time). This
            # loop is not a generator of its own: one hop less per event.
            loop = asyncio.get_running_loop()
            until = loop.time() + self.resync_period if self.resync_period else None
            attempts = Attempts(self.backoff, None, loop.time)
            while until is None or loop.time() < until:
                stream = self.api.watch(self.kind, self.version, self.namespace)
                # Without a resync period the stream is read as it is: no timer per event.
                events = stream if until is None else _bounded(stream, until)
                try:
                    async for event in events:
                        attempts.attempt = 0
                        if self.take(event):
                            yield event
                except Expired as exc:
                    log.info("watch of %s expired (%s); listing again", self.kind.plural, exc)
                    break
                except Exception as exc:
                    await self.pause(exc, attempts)
                finally:
                    await _close(events)
                    await _close(stream)

    def relist(self, listing: Listing) -> list[WatchEvent]:
        """A ``DELETED`` for every object gone since the last listing, then ``LISTED``."""
        self.version = listing.resource_version
        current = {object_key(obj) for obj in listing.items}
        gone = [self.tombstone(key) for key in sorted(self.known - current)]
        self.known = current
        return [*gone, listed(tuple(listing.items), self.version)]

    def tombstone(self, key: Key) -> WatchEvent:
        """The ``DELETED`` event of an object that vanished between two listings."""
        namespace, name = key
        meta: Obj = {"name": name, "resourceVersion": str(self.version)}
        if namespace:
            meta["namespace"] = namespace
        obj = {"apiVersion": self.kind.api_version, "kind": self.kind.kind, "metadata": meta}
        return WatchEvent(DELETED, obj)

    def take(self, event: WatchEvent) -> bool:
        """Note a watch event's version and object; whether to pass it on (not bookmarks).

        Only ADDED and DELETED change which objects exist (``known``); MODIFIED, the
        common event, costs no bookkeeping beyond the version."""
        meta = metadata(event.object)
        version = parse_version(meta.get("resourceVersion"))
        if version > self.version:
            self.version = version
        change = event.type
        if change == MODIFIED:
            return True
        if change == BOOKMARK:
            return False
        key = (meta.get("namespace") or "", meta.get("name") or "")
        if change == DELETED:
            self.known.discard(key)
        else:
            self.known.add(key)
        return True

    async def pause(self, exc: Exception, attempts: Attempts) -> None:
        """Wait before watching again after a transient ``exc``; raise a permanent one."""
        if not is_transient(exc):
            raise exc
        delay = attempts.next_delay() or self.backoff.cap
        what = self.kind.plural
        log.warning("watch of %s failed (%s); again in %.2fs", what, one_line(exc), delay)
        await asyncio.sleep(delay)


async def _bounded(stream: AsyncIterator[WatchEvent], until: float) -> AsyncIterator[WatchEvent]:
    """The events of ``stream`` until the loop time ``until``."""
    loop = asyncio.get_running_loop()
    while True:
        deadline = asyncio.timeout(max(0.0, until - loop.time()))
        try:
            async with deadline:
                event = await anext(stream)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if deadline.expired():
                return
            raise
        yield event


async def _close(stream: AsyncIterator[WatchEvent]) -> None:
    """Close an async generator (a watch's connection goes with it)."""
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        with contextlib.suppress(Exception):
            await closer()


@dataclass(frozen=True)
class Reflectors:
    """Reflector streams by kind over one ``ObjectApi``: what a consumer that only wants
    "everything, then every change" of a few kinds is given (the agent's policy sync)."""

    api: ObjectApi
    resync_period: float | None = None
    backoff: Backoff = WATCH_BACKOFF

    def watch(self, kind: Kind) -> AsyncIterator[WatchEvent]:
        """``LISTED``, then every change of ``kind`` in all namespaces, for ever."""
        return reflect(self.api, kind, None, self.resync_period, self.backoff)
