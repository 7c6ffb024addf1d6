"""The resource verbs: list, watch, get, create, update, patch, delete."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from podnet.api import listing, tables
from podnet.api.admission import Admission
from podnet.api.auth import RequestAttributes, User, require_authorized
from podnet.api.metrics import ApiMetrics
from podnet.api.params import QueryParams, parse_delete_options, parse_query, watch_timeout
from podnet.api.patch import patcher
from podnet.api.registry import Obj, Registry
from podnet.api.requests import Target, read_body, resolve, selectors
from podnet.api.watchcache import CachedEvent, WatchCache, WatchFilter, direct_events
from podnet.model import errors
from podnet.model.kinds import Kind

log = logging.getLogger(__name__)
BOOKMARK_EVERY = 10.0
# Exceptions that mean some input got past the checks: still a 500, but one that names the
# exception so a fuzz run shows what slipped through (the fix belongs in the checks).
SLIPPED = (RecursionError, UnicodeError, TypeError, KeyError, AttributeError, IndexError)
# Per-request values the middleware and handlers share.
USER = web.RequestKey("user", User)
VERB = web.RequestKey("verb", str)
RESOURCE = web.RequestKey("resource", str)
PARAMS = web.RequestKey("params", QueryParams)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


class ResourceHandlers:
    """HTTP handlers for every kind, over one registry and watch cache."""

    def __init__(self, registry: Registry, cache: WatchCache, metrics: ApiMetrics) -> None:
        self.registry = registry
        self.cache = cache
        self.metrics = metrics
        self.admission = Admission(registry)  # podnet.api.admission: after authorization

    # ---- routing ----------------------------------------------------------------------

    async def core(self, request: web.Request) -> web.StreamResponse:
        return await self._dispatch(request, "", request.match_info["version"])

    async def grouped(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        return await self._dispatch(request, info["group"], info["version"])

    async def _dispatch(self, request: web.Request, group: str, version: str) -> web.StreamResponse:
        target = resolve(group, version, request.match_info["tail"])
        params = request[PARAMS] = parse_query(request.query)  # 400 before any work
        verb = _verb(request.method, target, params.watch)
        request[VERB], request[RESOURCE] = verb, target.kind.plural
        handler = getattr(self, f"_{verb}", None)
        if handler is None:
            raise errors.method_not_allowed(f"{request.method} is not supported on this path")
        try:
            result: web.StreamResponse = await handler(request, target)
        except SLIPPED as exc:
            log.exception("unchecked input reached %s %s", request.method, request.path)
            raise errors.ApiError(
                f"internal error: {type(exc).__name__} while serving {verb}; "
                "the request got past podnet's input checks"
            ) from exc
        return result

    # ---- authorization ----------------------------------------------------------------

    def _check(
        self,
        request: web.Request,
        verb: str,
        target: Target,
        new: Obj | None = None,
        old: Obj | None = None,
    ) -> None:
        user = request[USER]
        attrs = RequestAttributes(
            verb=verb,
            kind=target.kind,
            namespace=target.namespace,
            name=target.name,
            subresource=target.subresource,
            new_object=new,
            old_object=old,
            path=request.path,
        )
        require_authorized(user, attrs)

    def _admit(
        self, request: web.Request, verb: str, target: Target
    ) -> Callable[[Obj | None, Obj | None], Awaitable[None]]:
        async def admit(new: Obj | None, old: Obj | None) -> None:
            self._check(request, verb, target, new, old)
            attrs = RequestAttributes(
                verb, target.kind, target.namespace, target.name, target.subresource, new, old
            )
            await self.admission.admit(request[USER], attrs)

        return admit

    # ---- reads ------------------------------------------------------------------------

    async def _get(self, request: web.Request, target: Target) -> web.StreamResponse:
        self._check(request, "get", target)
        assert target.name is not None
        obj = await self.registry.get(target.kind, target.namespace, target.name)
        if tables.wants_table(request.headers.get("Accept", "")):
            return json_response(
                tables.table(target.kind, [obj], obj["metadata"]["resourceVersion"])
            )
        return json_response(obj)

    async def _list(self, request: web.Request, target: Target) -> web.StreamResponse:
        self._check(request, "list", target)
        labels, fields = selectors(request, target.kind)
        params = request[PARAMS]
        await listing.check_list_revision(self.registry, params)
        items, revision = await self.registry.list(target.kind, target.namespace, labels, fields)
        page = listing.paginate(self.registry, target.kind, items, revision, params)
        if tables.wants_table(request.headers.get("Accept", "")):
            table = tables.table(target.kind, page.items, str(page.revision))
            if page.continue_token:
                table["metadata"]["continue"] = page.continue_token
            return json_response(table)
        return json_response(listing.list_body(target.kind, page))

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        self._check(request, "watch", target)
        labels, fields = selectors(request, target.kind)
        watch_filter = WatchFilter(target.kind, target.namespace, labels, fields)
        if target.name:
            from podnet.model.selectors import FieldRequirement

            watch_filter = WatchFilter(
                target.kind,
                target.namespace,
                labels,
                [*fields, FieldRequirement("metadata.name", "=", target.name)],
            )
        events = await self._watch_source(request, watch_filter)
        return await self._stream(request, target.kind, watch_filter, events)

    async def _watch_source(
        self, request: web.Request, wf: WatchFilter
    ) -> AsyncIterator[CachedEvent | int | Obj]:
        params = request[PARAMS]
        bookmarks = BOOKMARK_EVERY if params.allow_bookmarks else None
        revision = params.resource_version
        if not revision:  # absent or "0": the current state as ADDED events, then changes
            items, revision = await self.registry.list(wf.kind, wf.namespace, wf.labels, wf.fields)
            return _initial_then(items, self.cache.follow(revision, bookmarks))
        await listing.check_not_future(self.registry, revision)  # 504, never a hang
        await listing.check_not_compacted(self.registry, revision, "watch")
        if self.cache.covers(revision):
            return self.cache.follow(revision, bookmarks)
        return direct_events(self.registry, revision)

    async def _stream(
        self,
        request: web.Request,
        kind: Kind,
        wf: WatchFilter,
        events: AsyncIterator[CachedEvent | int | Obj],
    ) -> web.StreamResponse:
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        response = web.StreamResponse(
            headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        )
        await response.prepare(request)
        timeout = watch_timeout(request[PARAMS])
        self.metrics.watchers.labels(kind.plural).inc()
        first = [True]
        try:
            async with asyncio.timeout(timeout):
                async for item in events:
                    line = self._render(item, wf, kind, as_table, first)
                    if line is not None:
                        await response.write(line)
                        self.metrics.watch_events.labels(kind.plural).inc()
        except TimeoutError:
            pass
        except errors.ApiError as exc:
            with contextlib.suppress(ConnectionError):
                await response.write(dumps({"type": "ERROR", "object": exc.status()}) + b"\n")
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.metrics.watchers.labels(kind.plural).dec()
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    def _render(
        self,
        item: CachedEvent | int | Obj,
        wf: WatchFilter,
        kind: Kind,
        as_table: bool,
        first: list[bool],
    ) -> bytes | None:
        if isinstance(item, int):
            bookmark = {
                "kind": kind.kind,
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(item)},
            }
            return dumps({"type": "BOOKMARK", "object": bookmark}) + b"\n"
        if isinstance(item, dict):  # an initial ADDED from the list
            return self._line("ADDED", item, kind, as_table, first)
        seen = wf.view(item)
        if seen is None:
            return None
        if not as_table and seen == item.type and not wf.labels and not wf.fields:
            cached = item.rendered.get("json")
            if cached is None:
                cached = item.rendered["json"] = dumps({"type": seen, "object": item.obj}) + b"\n"
            return cached
        return self._line(seen, item.obj, kind, as_table, first)

    def _line(self, type_: str, obj: Obj, kind: Kind, as_table: bool, first: list[bool]) -> bytes:
        if as_table:
            obj = tables.table(kind, [obj], obj["metadata"]["resourceVersion"], headers=first[0])
            first[0] = False
        return dumps({"type": type_, "object": obj}) + b"\n"

    # ---- writes -----------------------------------------------------------------------

    async def _create(self, request: web.Request, target: Target) -> web.StreamResponse:
        body = await read_body(request)
        _check_type(body, target.kind)
        obj = await self.registry.create(
            target.kind, body, target.namespace, self._admit(request, "create", target)
        )
        return json_response(obj, 201)

    async def _update(self, request: web.Request, target: Target) -> web.StreamResponse:
        body = await read_body(request)
        _check_type(body, target.kind)
        _check_namespace(body, target)
        assert target.name is not None
        obj = await self.registry.update(
            target.kind,
            body,
            target.namespace,
            target.name,
            target.subresource,
            self._admit(request, "update", target),
        )
        return json_response(obj)

    async def _patch(self, request: web.Request, target: Target) -> web.StreamResponse:
        body = await read_body(request, patch=True)
        apply = patcher(request.content_type.lower(), body)  # 400 for a malformed patch
        assert target.name is not None
        obj = await self.registry.patch(
            target.kind,
            target.namespace,
            target.name,
            apply,
            target.subresource,
            self._admit(request, "patch", target),
        )
        return json_response(obj)

    async def _delete(self, request: web.Request, target: Target) -> web.StreamResponse:
        assert target.name is not None
        options = parse_delete_options(await read_body(request) if request.can_read_body else {})
        if options.uid is not None:  # checked on a read just before the delete
            current = await self.registry.get(target.kind, target.namespace, target.name)
            if current["metadata"].get("uid") != options.uid:
                raise errors.conflict(
                    target.kind.plural,
                    target.name,
                    f"Precondition failed: UID in precondition: {options.uid}, "
                    f"UID in object meta: {current['metadata'].get('uid')}",
                )
        obj = await self.registry.delete(
            target.kind,
            target.namespace,
            target.name,
            options.resource_version,
            self._admit(request, "delete", target),
        )
        return json_response(obj)


def _verb(method: str, target: Target, watch: bool) -> str:
    if method == "GET":
        if watch:
            return "watch"
        return "get" if target.name else "list"
    if method == "POST" and target.name is None:
        return "create"
    if method == "PUT" and target.name:
        return "update"
    if method == "PATCH" and target.name:
        return "patch"
    if method == "DELETE" and target.name:
        return "delete"
    return "unsupported"


def _check_type(body: Any, kind: Kind) -> None:
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    api_version, given = body.get("apiVersion"), body.get("kind")
    if given is not None and given != kind.kind:
        raise errors.bad_request(f"the body is a {given!s}, but the URL is for {kind.kind}")
    if api_version is not None and api_version != kind.api_version:
        raise errors.bad_request(f"apiVersion {api_version!s} does not match {kind.api_version}")


def _check_namespace(body: dict[str, Any], target: Target) -> None:
    """A body may repeat the URL's namespace, never name another one (kube: 400)."""
    meta = body.get("metadata")
    given = meta.get("namespace") if isinstance(meta, dict) else None
    if target.kind.namespaced and given and given != target.namespace:
        raise errors.bad_request(
            "the namespace of the provided object does not match the namespace sent on "
            f"the request ({given!s} != {target.namespace})"
        )


async def _initial_then(
    items: list[Obj], rest: AsyncIterator[CachedEvent | int]
) -> AsyncIterator[CachedEvent | int | Obj]:
    for obj in items:
        yield obj
    async for event in rest:
        yield event
