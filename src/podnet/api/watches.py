"""Serving one watch request: the initial state, then the changes.

Two paths. The usual one (JSON) replays what the watcher has missed in bounded writes
(``podnet.api.replay``), then hands the connection's transport to the cache's fan-out
(``podnet.api.fanout``): events are encoded once and written, pre-framed, to every
watcher; the handler only waits for the watch to end. A Table watch renders and writes
each event for its one watcher.

``resourceVersion`` of a watch: unset is "the current state, then changes", the state
read consistently (``podnet.api.listing``); ``0`` is any cached state, then changes;
``N`` replays the changes after ``N``: 410 Expired when ``N`` is older than the cache's
ring, or when the replay would exceed a live watcher's backlog bound, as kube-apiserver's
watch cache answers; the client relists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import cast

from aiohttp import web

from podnet.api import listing, storedform, tables
from podnet.api.cachedobjects import CachedEvent, CachedObject, WatchFilter
from podnet.api.fanout import END, error_line, frame
from podnet.api.metrics import ApiMetrics
from podnet.api.params import QueryParams, watch_timeout
from podnet.api.registry import Obj, Registry
from podnet.api.replay import OverBudget, added_chunks, replay
from podnet.api.watchcache import BOOKMARK_EVERY, WatchCache
from podnet.model import errors
from podnet.model.kinds import Kind

log = logging.getLogger("podnet.api.watches")

CLOSE_GRACE = 60.0  # seconds a dropped watcher gets to read its 410 before the abort
Stream = AsyncIterator[CachedEvent | int | Obj]


class WatchServer:
    """Answers watch requests from the watch cache (or etcd for old revisions)."""

    def __init__(self, registry: Registry, cache: WatchCache, metrics: ApiMetrics) -> None:
        self.registry = registry
        self.cache = cache
        self.metrics = metrics

    async def serve(
        self, request: web.Request, wf: WatchFilter, params: QueryParams, as_table: bool
    ) -> web.StreamResponse:
        revision = params.resource_version
        initial: list[CachedObject] = []
        if not revision:  # absent or "0": the current state as ADDED events, then changes
            # Consistent if the cache catches up with etcd in time; else its own state.
            await listing.cache_can_serve(self.registry, self.cache, params)
            selected, revision = self.cache.objects(wf.kind, wf.namespace, wf.labels, wf.fields)
            initial = [obj for _, obj in selected]
        else:
            if revision > self.cache.latest_revision:  # the cache never runs ahead of etcd
                await listing.check_not_future(self.registry, revision)  # 504, never a hang
            await listing.check_not_compacted(self.registry, revision, "watch")
            await self.cache.wait_for(revision, listing.FRESH_WAIT)
            if not self.cache.covers(revision):  # kube's watch cache: relist
                self.metrics.watches_expired.labels(wf.kind.plural, "too_old").inc()
                raise errors.gone(
                    f"too old resource version: {revision} (the watch cache holds the "
                    "changes after a later one)"
                )
        if as_table:
            bookmarks = BOOKMARK_EVERY if params.allow_bookmarks else None
            events = _initial_then([o.obj for o in initial], self.cache.follow(revision, bookmarks))
            return await self._stream(request, wf, params, as_table, events)
        return await self._fanout(request, wf, params, initial, revision)

    async def _fanout(
        self,
        request: web.Request,
        wf: WatchFilter,
        params: QueryParams,
        initial: list[CachedObject],
        revision: int,
    ) -> web.StreamResponse:
        response = _stream_response()
        await response.prepare(request)
        plural = wf.kind.plural
        self.metrics.watchers.labels(plural).inc()
        watcher, outcome = None, None
        try:
            for chunk in added_chunks(initial):
                await response.write(chunk)
            limit = self.cache.fanout.backlog_limit
            revision = await replay(self.cache, wf, revision, response.write, limit)
            transport = request.transport
            if transport is None or transport.is_closing():
                return response
            watcher = self.cache.watch(wf, transport, revision, params.allow_bookmarks)
            async with asyncio.timeout(watch_timeout(params)):
                outcome = await asyncio.shield(watcher.done)
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            pass
        except errors.ApiError as exc:  # 410 during the replay: the client relists
            why = "over_budget" if isinstance(exc, OverBudget) else "too_old"
            self.metrics.watches_expired.labels(plural, why).inc()
            with contextlib.suppress(ConnectionError):
                await response.write(error_line(exc) + b"\n")
        finally:
            self.metrics.watchers.labels(plural).dec()
            if watcher is not None:
                self.cache.unwatch(watcher)
                self.metrics.watch_events.labels(plural).inc(watcher.sent + len(initial))
        if outcome is not None and watcher is not None:
            await _end_with(watcher.sink, outcome)
            return response
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    async def _stream(
        self,
        request: web.Request,
        wf: WatchFilter,
        params: QueryParams,
        as_table: bool,
        events: Stream,
    ) -> web.StreamResponse:
        """One watcher, rendered and written event by event."""
        response = _stream_response()
        await response.prepare(request)
        kind = wf.kind
        self.metrics.watchers.labels(kind.plural).inc()
        first = [True]
        try:
            async with asyncio.timeout(watch_timeout(params)):
                async for item in events:
                    line = _render(item, wf, kind, as_table, first)
                    if line is not None:
                        await response.write(line)
                        self.metrics.watch_events.labels(kind.plural).inc()
        except TimeoutError:
            pass
        except errors.ApiError as exc:
            with contextlib.suppress(ConnectionError):
                await response.write(error_line(exc) + b"\n")
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception as exc:  # the head is sent: say it in an ERROR event, never a 2nd answer
            log.warning("watch of %s from etcd ended: %r", kind.plural, exc)
            with contextlib.suppress(ConnectionError):
                why = errors.gone(f"the watch ended ({type(exc).__name__}): list again")
                await response.write(error_line(why) + b"\n")
        finally:
            self.metrics.watchers.labels(kind.plural).dec()
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response


async def _end_with(sink: object, error: errors.ApiError) -> None:
    """Tell a dropped watcher why (after what it has not read yet), then hang up.

    Its backlog is bounded (``podnet.api.fanout``); it gets ``CLOSE_GRACE`` seconds to
    read it and the ERROR event, then the connection is aborted.
    """
    # The transport itself: uvloop's TLS transport is not an asyncio.WriteTransport
    # subclass, so it is reached by what it has, not by its class.
    sink = cast(asyncio.WriteTransport, sink)
    sink.write(frame(error_line(error) + b"\n") + END)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CLOSE_GRACE
    while sink.get_write_buffer_size() and not sink.is_closing() and loop.time() < deadline:
        await asyncio.sleep(0.1)
    if sink.get_write_buffer_size():
        sink.abort()
    else:
        sink.close()


def _stream_response() -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    return response


def _render(
    item: CachedEvent | int | Obj, wf: WatchFilter, kind: Kind, as_table: bool, first: list[bool]
) -> bytes | None:
    if isinstance(item, int):
        bookmark = {
            "kind": kind.kind,
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(item)},
        }
        return storedform.dumps({"type": "BOOKMARK", "object": bookmark}) + b"\n"
    if isinstance(item, dict):  # an initial ADDED from the list
        return _line("ADDED", item, kind, as_table, first)
    seen = wf.view(item)
    if seen is None:
        return None
    if not as_table:
        return item.line(seen)
    return _line(seen, item.obj, kind, as_table, first)


def _line(type_: str, obj: Obj, kind: Kind, as_table: bool, first: list[bool]) -> bytes:
    if as_table:
        obj = tables.table(kind, [obj], obj["metadata"]["resourceVersion"], headers=first[0])
        first[0] = False
    return storedform.dumps({"type": type_, "object": obj}) + b"\n"


async def _initial_then(
    items: list[Obj], rest: AsyncIterator[CachedEvent | int]
) -> AsyncIterator[CachedEvent | int | Obj]:
    for obj in items:
        yield obj
    async for event in rest:
        yield event
