"""The resource verbs: list, watch, get, create, update, patch, delete."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from podnet.api import listing, storedform, tables
from podnet.api.admission import Admission
from podnet.api.auth import RequestAttributes, User, require_authorized, require_rule
from podnet.api.cachedobjects import WatchFilter
from podnet.api.csrrestriction import is_csr, own_fields, require_own
from podnet.api.limits import RequestLimits
from podnet.api.metrics import ApiMetrics
from podnet.api.params import QueryParams, parse_delete_options, parse_query
from podnet.api.patch import patcher
from podnet.api.registry import Obj, Registry
from podnet.api.requests import Target, read_body, resolve, selectors
from podnet.api.watchcache import WatchCache
from podnet.api.watches import WatchServer
from podnet.model import errors
from podnet.model.kinds import EVENT, Kind
from podnet.model.selectors import FieldRequirement

log = logging.getLogger(__name__)
LIST_PART = 2000  # a list with more items is written in parts of this many
BIG_BODY = 1 << 20  # a full list larger than this is written without a copy
# Exceptions that mean some input got past the checks: still a 500, but one that names the
# exception so a fuzz run shows what slipped through (the fix belongs in the checks).
SLIPPED = (RecursionError, UnicodeError, TypeError, KeyError, AttributeError, IndexError)
# Per-request values the middleware and handlers share.
USER = web.RequestKey("user", User)
VERB = web.RequestKey("verb", str)
RESOURCE = web.RequestKey("resource", str)
PARAMS = web.RequestKey("params", QueryParams)
# (kind, object, message) of a write that is stored but not enforced: the server warns
# the writer and records an Event once the write succeeded.
NOTICE = web.RequestKey("notice", tuple)


dumps = storedform.dumps


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


class ResourceHandlers:
    """HTTP handlers for every kind, over one registry and watch cache."""

    def __init__(
        self,
        registry: Registry,
        cache: WatchCache,
        metrics: ApiMetrics,
        limits: RequestLimits | None = None,
    ) -> None:
        self.registry = registry
        self.cache = cache
        self.metrics = metrics
        self.limits = limits or RequestLimits()  # podnet.api.limits: per identity
        self.admission = Admission(registry, cache=cache)  # podnet.api.admission: after authz
        self.watches = WatchServer(registry, cache, metrics)

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
            with self.limits.hold(request[USER].name, verb):  # 429 over the identity's cap
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

    def _precheck(self, request: web.Request, verb: str, target: Target) -> None:
        """The rules alone, before a write reads its target (no existence leak)."""
        require_rule(
            request[USER],
            RequestAttributes(
                verb, target.kind, target.namespace, target.name, target.subresource, None, None
            ),
        )

    def _admit(
        self, request: web.Request, verb: str, target: Target
    ) -> Callable[[Obj | None, Obj | None], Awaitable[None]]:
        async def admit(new: Obj | None, old: Obj | None) -> None:
            self._check(request, verb, target, new, old)
            attrs = RequestAttributes(
                verb, target.kind, target.namespace, target.name, target.subresource, new, old
            )
            warning = await self.admission.admit(request[USER], attrs)
            if warning is not None and new is not None and target.kind is not None:
                request[NOTICE] = (target.kind, new, warning)  # podnet.api.egressnotice

        return admit

    # ---- reads ------------------------------------------------------------------------

    async def _get(self, request: web.Request, target: Target) -> web.StreamResponse:
        self._check(request, "get", target)
        assert target.name is not None
        if is_csr(target.kind) and not request[USER].is_admin:
            return await self._get_own(request, target)
        kv = await self.registry.get_stored(target.kind, target.namespace, target.name)
        if tables.wants_table(request.headers.get("Accept", "")):
            obj = self.registry.decode(kv)
            return json_response(
                tables.table(target.kind, [obj], obj["metadata"]["resourceVersion"])
            )
        body = storedform.splice(kv.value, kv.mod_revision)
        return web.Response(body=body, content_type="application/json")

    async def _get_own(self, request: web.Request, target: Target) -> web.StreamResponse:
        """A CSR read by its requester: another's, or a missing one, is a 403."""
        assert target.name is not None
        try:
            obj: Obj | None = await self.registry.get(target.kind, None, target.name)
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            obj = None
        require_own(request[USER], obj, target.name)
        assert obj is not None
        if tables.wants_table(request.headers.get("Accept", "")):
            revision = obj["metadata"]["resourceVersion"]
            return json_response(tables.table(target.kind, [obj], revision))
        return json_response(obj)

    async def _list(self, request: web.Request, target: Target) -> web.StreamResponse:
        self._check(request, "list", target)
        labels, fields = selectors(request, target.kind)
        fields = [*fields, *own_fields(request[USER], target.kind)]  # a requester's own CSRs
        params = request[PARAMS]
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        if await listing.cache_can_serve(self.registry, self.cache, params):
            if not (as_table or labels or fields or target.namespace or params.limit) and (
                params.continue_token is None
            ):
                return await self._everything(request, target.kind)
            selected, revision = self.cache.objects(target.kind, target.namespace, labels, fields)
            cached = listing.page_of(selected, revision, params)
            if not as_table:
                return await _send_list(request, target.kind, cached)
            items = [o.obj for o in cached.items]
            page: listing.Page[Obj] = listing.Page(
                items, cached.revision, cached.continue_token, cached.remaining
            )
        else:
            items, revision = await listing.read_from_etcd(
                self.registry, target.kind, target.namespace, labels, fields
            )
            page = listing.paginate(self.registry, target.kind, items, revision, params)
        if as_table:
            table = tables.table(target.kind, page.items, str(page.revision))
            if page.continue_token:
                table["metadata"]["continue"] = page.continue_token
            return json_response(table)
        return json_response(listing.list_body(target.kind, page))

    async def _everything(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        """A list of every object of ``kind``: the cache's joined bytes, as they are (a
        large one written in three parts, not copied into one body)."""
        joined, _, revision = self.cache.everything(kind)
        head = listing.list_head(kind, listing.Page([], revision))
        if len(joined) < BIG_BODY:
            body = b"".join((head, joined, b"]}"))
            return web.Response(body=body, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(head) + len(joined) + 2
        await response.prepare(request)
        await response.write(head)
        await response.write(joined)
        await response.write_eof(b"]}")
        return response

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        self._check(request, "watch", target)
        labels, fields = selectors(request, target.kind)
        fields = [*fields, *own_fields(request[USER], target.kind)]
        if target.name:
            fields = [*fields, FieldRequirement("metadata.name", "=", target.name)]
        watch_filter = WatchFilter(target.kind, target.namespace, labels, tuple(fields))
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        return await self.watches.serve(request, watch_filter, request[PARAMS], as_table)

    # ---- writes -----------------------------------------------------------------------

    async def _create(self, request: web.Request, target: Target) -> web.StreamResponse:
        self._precheck(request, "create", target)  # 403 before the body is judged (422)
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
        if target.subresource == "finalize":
            return json_response(await self._finalize(request, target))
        self._precheck(request, "update", target)
        admit = self._admit(request, "update", target)
        known = self._cached_version(target, body)
        if known is not None:
            try:
                obj = await self.registry.update(
                    target.kind,
                    body,
                    target.namespace,
                    target.name,
                    target.subresource,
                    admit,
                    known,
                )
            except errors.ApiError:
                obj = known  # failed over the cached copy: the answer comes from etcd, below
            if obj is not known:
                return json_response(obj)
        obj = await self.registry.update(
            target.kind, body, target.namespace, target.name, target.subresource, admit
        )
        return json_response(obj)

    def _cached_version(self, target: Target, body: Obj) -> Obj | None:
        """The watch cache's copy of the object a PUT replaces, when it is the version the
        body names (its ``resourceVersion``): then the write's precondition (that very
        revision in etcd) makes the etcd read before it redundant, as kube's
        GuaranteedUpdate does with its cached object. Whenever the write over it fails
        or changes nothing, the caller asks again with a read of etcd, so every answer
        but a successful write is the one a fresh read gives."""
        meta = body.get("metadata")
        expected = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if not expected or target.kind is EVENT or target.name is None:
            return None  # (an Event write counts against its quota in admission)
        cached = self.cache.current(target.kind, target.namespace, target.name)
        if cached is None or str(cached.revision) != str(expected):
            return None
        return cached.obj

    async def _finalize(self, request: web.Request, target: Target) -> Obj:
        """PUT namespaces/<name>/finalize: remove a Terminating Namespace for good (the
        namespace controller calls it once the contents are gone)."""
        assert target.name is not None
        self._check(request, "update", target)
        current = await self.registry.get(target.kind, None, target.name)
        if not current["metadata"].get("deletionTimestamp"):
            raise errors.conflict(target.kind.plural, target.name, "it is not terminating")
        return await self.registry.finalize_namespace(target.name)

    async def _patch(self, request: web.Request, target: Target) -> web.StreamResponse:
        body = await read_body(request, patch=True)
        apply = patcher(request.content_type.lower(), body)  # 400 for a malformed patch
        assert target.name is not None
        self._precheck(request, "patch", target)
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
        if options.grace_period_seconds is None:  # the query's, as kube reads it too
            options = replace(options, grace_period_seconds=request[PARAMS].grace_period_seconds)
        self._precheck(request, "delete", target)
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
            options,
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


async def _send_list(
    request: web.Request, kind: Kind, page: listing.CachedPage
) -> web.StreamResponse:
    """A cached page as JSON, spliced from stored bytes; a large one written in parts."""
    head = listing.list_head(kind, page)
    items = page.items
    if len(items) <= LIST_PART:
        body = head + b",".join(obj.wire for obj in items) + b"]}"
        return web.Response(body=body, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(head)
    for start in range(0, len(items), LIST_PART):
        part = b",".join(obj.wire for obj in items[start : start + LIST_PART])
        await response.write(part if start == 0 else b"," + part)
    await response.write_eof(b"]}")
    return response
