"""List semantics: where a list is read from, resourceVersion rules, limit/continue pages.

Lists are served from the watch cache (``podnet.api.watchcache``) as kube-apiserver does,
assembled from stored bytes (``podnet.api.storedform.splice``). What ``resourceVersion``
means here:

- unset: a consistent read, as kube 1.31's consistent list from cache. podnet asks etcd
  for its current revision (one cheap round trip, no data), waits up to
  ``CONSISTENT_WAIT`` for the cache to reach it, and serves the cache. If the cache does
  not get there in time (a write outside the registry prefix moved etcd's revision and
  no registry change followed), the list is read from etcd itself.
- ``0``: any cached state, at once, without touching etcd.
- ``N`` (``NotOlderThan``, the default match): at least ``N``. Served from the cache at
  once if it has seen ``N``; a revision newer than etcd's is 504 ``Timeout`` with a
  ``ResourceVersionTooLarge`` cause at once; otherwise the cache is given up to
  ``FRESH_WAIT`` (kube waits 3 s), then etcd answers.
- ``N`` with ``resourceVersionMatch=Exact``: read from etcd; podnet reads etcd at the
  latest revision only, so an older ``N`` is 410 Gone and the client relists.
- ``limit``/``continue``: pages in key order. The token is opaque base64 of the first
  page's revision and the last key returned; later pages show the objects after that key
  as they are in the cache then, and carry the first page's revision. A token whose
  revision etcd has compacted is 410 Gone (``Expired``), as in kube; one that does not
  decode is 400.
"""

from __future__ import annotations

import asyncio
import bisect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from podnet.api import storedform
from podnet.api.cachedobjects import CachedObject, WatchFilter
from podnet.api.fanout import pinned_name
from podnet.api.objects import matches
from podnet.api.params import ContinueToken, QueryParams
from podnet.api.registry import Obj, Registry
from podnet.api.watchcache import WatchCache
from podnet.model import errors
from podnet.model.kinds import Kind
from podnet.model.selectors import FieldRequirement, LabelSelector
from podnet.store.base import Compacted, Store

CONSISTENT_WAIT = 0.5
FRESH_WAIT = 3.0


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: its items, revision and where the next page starts."""

    items: list[T]
    revision: int
    continue_token: str | None = None
    remaining: int | None = None


CachedPage = Page[CachedObject]  # served from the cache: objects as bytes, not decoded


class RevisionReads:
    """etcd's current revision for many callers with one read in flight.

    A caller joins the next read, which is sent after it arrived (never one already on
    its way): the answer is at least the revision current when the caller asked, as its
    own read would be. Thousands of lists and watches arriving together (a registration
    storm) cost one etcd round trip per round instead of one each.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0  # round trips made (tests count them)
        self._next: asyncio.Future[int] | None = None  # callers waiting for the next read
        self._reader: asyncio.Task[None] | None = None

    async def current(self) -> int:
        loop = asyncio.get_running_loop()
        waiting = self._next
        if waiting is None or waiting.get_loop() is not loop:
            waiting = self._next = loop.create_future()
        if self._reader is None or self._reader.done():
            self._reader = loop.create_task(self._read())
        return await asyncio.shield(waiting)

    async def _read(self) -> None:
        while self._next is not None:
            waiting, self._next = self._next, None
            self.reads += 1
            try:
                waiting.set_result(await self.store.revision())
            except Exception as exc:
                waiting.set_exception(exc)
                waiting.exception()  # retrieved: its callers may all have gone away


_reads: weakref.WeakKeyDictionary[Store, RevisionReads] = weakref.WeakKeyDictionary()


def revision_reads(store: Store) -> RevisionReads:
    """The one ``RevisionReads`` of ``store``."""
    reads = _reads.get(store)
    if reads is None:
        reads = _reads[store] = RevisionReads(store)
    return reads


async def check_not_future(registry: Registry, revision: int | None) -> int:
    """etcd's current revision; 504 if ``revision`` is newer than it."""
    current = await revision_reads(registry.store).current()
    if revision is not None and revision > current:
        raise errors.resource_version_too_large(revision, current)
    return current


async def check_not_compacted(registry: Registry, revision: int, what: str) -> None:
    """410 Gone if etcd has compacted ``revision`` away."""
    try:
        await registry.store.check_revision(revision)
    except Compacted as exc:
        raise errors.gone(f"too old resource version: {revision} ({what}: {exc})") from exc


async def check_list_revision(registry: Registry, params: QueryParams) -> None:
    """The list rules for ``resourceVersion``/``resourceVersionMatch`` and ``continue``."""
    if not params.resource_version and params.continue_token is None:
        return  # the usual list: latest state, no extra etcd round trip
    current = await check_not_future(registry, params.resource_version)
    if params.resource_version_match == "Exact" and params.resource_version != current:
        raise errors.gone(
            f"too old resource version: {params.resource_version} (podnet lists at the "
            f"latest revision, {current}; list again without an exact resourceVersion)"
        )
    token = params.continue_token
    if token is not None:
        if token.revision > current:
            raise errors.bad_request("continue key is not valid: revision from the future")
        # The page's own revision must still be readable (check_not_compacted asks for
        # the changes after its argument).
        await check_not_compacted(registry, token.revision - 1, "the continue token expired")


async def cache_can_serve(registry: Registry, cache: WatchCache, params: QueryParams) -> bool:
    """Apply the rules above; True when the cache answers this list, False for etcd."""
    if not cache.ready.is_set() or params.resource_version_match == "Exact":
        await check_list_revision(registry, params)
        return False
    token = params.continue_token
    if token is not None:
        await check_list_revision(registry, params)
        return await cache.wait_for(token.revision, FRESH_WAIT)
    wanted = params.resource_version
    if wanted == 0:
        return True
    if wanted is not None and cache.latest_revision >= wanted:
        return True
    current = await check_not_future(registry, wanted)
    wait = CONSISTENT_WAIT if wanted is None else FRESH_WAIT
    return await cache.wait_for(wanted or current, wait)


async def read_from_etcd(
    registry: Registry,
    kind: Kind,
    namespace: str | None,
    labels: LabelSelector | None,
    fields: Sequence[FieldRequirement],
) -> tuple[list[Obj], int]:
    """``registry.list`` for a list the cache could not answer in time; one pinned to a
    name by ``metadata.name=<name>`` reads only the keys starting with that name's key
    (the field still decides), not every object of the kind: under load the cache lags,
    and thousands of agents each listing their own HostSubnet read one key, not 5,000."""
    name = pinned_name(WatchFilter(kind, namespace, labels, fields))
    if name is None or (kind.namespaced and not namespace):
        return await registry.list(kind, namespace, labels, fields)
    kvs, revision = await registry.store.list(registry.key(kind, namespace, name))
    decoded = (registry.decode(kv) for kv in kvs)
    return [obj for obj in decoded if matches(obj, labels, fields)], revision


def page_of(keyed: Sequence[tuple[str, T]], revision: int, params: QueryParams) -> Page[T]:
    """The page of ``keyed`` (in key order) that ``limit`` and ``continue`` select; reads
    only the page's items and O(log n) keys of a lazy ``keyed`` (a ``KeyedView``)."""
    token = params.continue_token
    if token is not None:
        start = bisect.bisect_right(keyed, token.start_after, key=_first)
        keyed = keyed[start:]
        revision = token.revision
    if not params.limit or len(keyed) <= params.limit:
        return Page([item for _, item in keyed], revision)
    page = keyed[: params.limit]
    next_token = ContinueToken(revision, page[-1][0]).encode()
    return Page([item for _, item in page], revision, next_token, len(keyed) - params.limit)


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


def paginate(
    registry: Registry, kind: Kind, items: list[Obj], revision: int, params: QueryParams
) -> Page[Obj]:
    """``page_of`` objects read from etcd (keyed and sorted first)."""
    keyed = sorted(((_key(registry, kind, obj), obj) for obj in items), key=lambda kv: kv[0])
    return page_of(keyed, revision, params)


def _key(registry: Registry, kind: Kind, obj: Obj) -> str:
    """The object's name relative to the kind: ``namespace/name`` or ``name``."""
    meta = obj["metadata"]
    return registry.key(kind, meta.get("namespace"), meta["name"])[
        len(registry.kind_prefix(kind)) :
    ]


def list_meta(page: Page[Any]) -> Obj:
    meta: Obj = {"resourceVersion": str(page.revision)}
    if page.continue_token:
        meta["continue"] = page.continue_token
        meta["remainingItemCount"] = page.remaining
    return meta


def list_body(kind: Kind, page: Page[Obj]) -> Obj:
    """The ``<Kind>List`` object of one page."""
    return {
        "kind": kind.list_kind,
        "apiVersion": kind.api_version,
        "metadata": list_meta(page),
        "items": page.items,
    }


def list_head(kind: Kind, page: CachedPage) -> bytes:
    """The JSON of a cached page's ``<Kind>List`` up to its first item."""
    head = storedform.dumps(
        {"kind": kind.list_kind, "apiVersion": kind.api_version, "metadata": list_meta(page)}
    )
    return head[:-1] + b',"items":['
