"""The skeleton every master controller shares: start, stop, and events into work.

A controller names the kinds it follows, in start order (``watches``). ``start`` opens one
stream per kind through the object API (the client's reflector: a listing, then its
changes, a new listing after 410 Expired or a resync period) and feeds each to its
handler up to the end of the first listing, kind after kind: every HostSubnet is marked
allocated before the first Node is looked at. It then calls ``synced`` (a hook), starts
the work queue, the watches and any ``background`` tasks, waits until the queue has
handled what the listings queued, and returns: a started controller is synced. ``stop``
cancels all of it and waits.

A handler gets ``(change, obj)``: ``SYNC`` for each object of a listing, then ``SYNCED``
(``obj`` carries only the listing's resourceVersion), and ``ADDED``/``MODIFIED``/``DELETED``
as they happen. Handlers turn them into queue keys; ``track`` does the common part (keep
an ``ObjectCache`` in step, name the object that changed) and ``is_marker`` the part every
handler starts with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from podnet.client.reflector import reflect
from podnet.client.watch import DELETED, LISTED
from podnet.controllers.cache import ObjectCache, revision_of
from podnet.controllers.calls import ControllerApi
from podnet.controllers.workqueue import KeyedQueue, cancel_all, spawn
from podnet.model.kinds import Kind

Obj = dict[str, Any]
Change = tuple[str, Obj]
Handler = Callable[[str, Obj], None]
SYNC, SYNCED = "SYNC", "SYNCED"


@dataclass(frozen=True)
class Watch:
    """One kind a controller follows, and the handler its events go to."""

    kind: Kind
    handle: Handler
    resync: bool = True  # relist every resync period (besides after a 410)


def is_marker(cache: ObjectCache, change: str, obj: Obj) -> bool:
    """Whether a stream item is the end-of-listing marker (``SYNCED``), not an object.

    The end of a full listing supersedes the deletions ``cache`` remembers.
    """
    if change == SYNCED:
        cache.forget_deletions(revision_of(obj))
        return True
    return False


def track(
    cache: ObjectCache,
    change: str,
    obj: Obj,
    remember: Callable[[Obj], object] | None = None,
    forget: Callable[[str, int], object] | None = None,
) -> str | None:
    """Keep ``cache`` in step with one stream item; the name changed (None for a marker).

    ``remember`` and ``forget`` replace ``cache.put`` and ``cache.remove`` for a controller
    that keeps more in step with its cache (the allocator's marks).
    """
    if is_marker(cache, change, obj):
        return None
    name: str = obj["metadata"]["name"]
    if change == DELETED:
        (forget or cache.remove)(name, revision_of(obj))
    else:
        (remember or cache.put)(obj)
    return name


class Controller:
    """Start, stop and supervise one controller; subclasses say what to watch and do."""

    name = "controller"  # its work queue's and tasks' names

    def __init__(
        self, api: ControllerApi, workers: int = 0, resync_period: float | None = 300.0
    ) -> None:
        self.api = api
        self.log = logging.getLogger(type(self).__module__)
        self.ready = False
        self.resync_period = resync_period
        self.queue = KeyedQueue(self.name, self.reconcile, workers)  # no workers: unused
        self._tasks: list[asyncio.Task[Any]] = []

    # ---- what a controller says -------------------------------------------------------

    def watches(self) -> list[Watch]:
        """The kinds to follow, in the order their first listings are taken in."""
        raise NotImplementedError

    async def reconcile(self, key: str) -> None:
        """Handle one queued key (controllers with a work queue)."""

    async def synced(self) -> None:
        """Called once every first listing is in, before the workers start."""

    def background(self) -> list[tuple[Coroutine[Any, Any, Any], str]]:
        """Extra long-running work started with the watches: (coroutine, task name)."""
        return []

    def summary(self) -> str:
        """What the controller holds, for the "synced" log line."""
        return ""

    # ---- the skeleton -----------------------------------------------------------------

    @property
    def tasks(self) -> list[asyncio.Task[Any]]:
        """The controller's long-running tasks (for the manager to supervise)."""
        return self._tasks + self.queue.tasks

    async def start(self) -> None:
        """List every watched kind in order, start the work, return once synced."""
        opened: list[tuple[AsyncIterator[Change], Watch]] = []
        try:
            for watch in self.watches():
                period = self.resync_period if watch.resync else None
                stream = changes(self.api, watch.kind, period)
                opened.append((stream, watch))
                count = await _consume_until_synced(stream, watch.handle)
                self.log.info("%s: listed %d %s", self.name, count, watch.kind.plural)
            await self.synced()
        except BaseException:
            for stream, _ in opened:
                await _close(stream)
            raise
        self.queue.start()
        for stream, watch in opened:
            spawn(self._tasks, _pump(stream, watch.handle), f"{self.name}-{watch.kind.plural}")
        for work, task_name in self.background():
            spawn(self._tasks, work, task_name)
        await self.queue.wait_idle()
        self.ready = True
        self.log.info("%s synced%s", self.name, f": {s}" if (s := self.summary()) else "")

    async def stop(self) -> None:
        """Stop the watches, the workers and the background tasks; wait for them."""
        self.ready = False
        await self.queue.stop()
        await cancel_all(self._tasks)
        self._tasks.clear()


async def changes(
    api: ControllerApi, kind: Kind, resync_period: float | None
) -> AsyncIterator[Change]:
    """The reflector's events for ``kind`` as ``(change, obj)``: a listing is ``SYNC`` for
    each object, then ``SYNCED``."""
    async for event in reflect(api, kind, resync_period=resync_period):
        if event.type == LISTED:
            for obj in event.items:
                yield SYNC, obj
            yield SYNCED, event.object
        else:
            yield str(event.type), event.object


async def _consume_until_synced(stream: AsyncIterator[Change], handle: Handler) -> int:
    """Feed ``stream`` to ``handle`` up to and including the first ``SYNCED``; count objects."""
    count = 0
    async for change, obj in stream:
        handle(change, obj)
        if change == SYNCED:
            return count
        count += 1
    return count


async def _pump(stream: AsyncIterator[Change], handle: Handler) -> None:
    """Feed ``stream`` to ``handle`` for ever (closing it when cancelled)."""
    try:
        async for change, obj in stream:
            handle(change, obj)
    finally:
        await _close(stream)


async def _close(stream: AsyncIterator[Change]) -> None:
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        with contextlib.suppress(Exception):
            await closer()
