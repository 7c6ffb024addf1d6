"""List semantics on top of the registry: resourceVersion rules and limit/continue pages.

podnet reads lists from etcd at the latest revision (a consistent read). What the
parameters mean here, against what kube-apiserver does:

- ``resourceVersion`` newer than etcd's revision: 504 ``Timeout`` with a
  ``ResourceVersionTooLarge`` cause, at once. (kube waits up to 3 s for its watch cache to
  catch up with etcd; podnet reads etcd itself, so waiting cannot help.)
- ``resourceVersionMatch=Exact`` for an older revision: 410 Gone, so a client relists.
- ``limit``/``continue``: pages in key order. The token is opaque base64 of the first
  page's revision and the last key returned; later pages show the objects after that key
  as they are now, and carry the first page's revision. A token whose revision etcd has
  compacted is 410 Gone, as in kube; one that does not decode is 400.
"""

from __future__ import annotations

from dataclasses import dataclass

from podnet.api.params import ContinueToken, QueryParams
from podnet.api.registry import Obj, Registry
from podnet.model import errors
from podnet.model.kinds import Kind
from podnet.store.base import Compacted


@dataclass(frozen=True)
class Page:
    """One page of a list: its items, revision and where the next page starts."""

    items: list[Obj]
    revision: int
    continue_token: str | None = None
    remaining: int | None = None


async def check_not_future(registry: Registry, revision: int | None) -> int:
    """etcd's current revision; 504 if ``revision`` is newer than it."""
    current = await registry.store.revision()
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


def paginate(
    registry: Registry, kind: Kind, items: list[Obj], revision: int, params: QueryParams
) -> Page:
    """The page of ``items`` (in key order) that ``limit`` and ``continue`` select."""
    keyed = sorted(((_key(registry, kind, obj), obj) for obj in items), key=lambda kv: kv[0])
    token = params.continue_token
    if token is not None:
        keyed = [(key, obj) for key, obj in keyed if key > token.start_after]
        revision = token.revision
    if not params.limit or len(keyed) <= params.limit:
        return Page([obj for _, obj in keyed], revision)
    page = keyed[: params.limit]
    next_token = ContinueToken(revision, page[-1][0]).encode()
    return Page([obj for _, obj in page], revision, next_token, len(keyed) - params.limit)


def _key(registry: Registry, kind: Kind, obj: Obj) -> str:
    """The object's name relative to the kind: ``namespace/name`` or ``name``."""
    meta = obj["metadata"]
    return registry.key(kind, meta.get("namespace"), meta["name"])[
        len(registry.kind_prefix(kind)) :
    ]


def list_body(kind: Kind, page: Page) -> Obj:
    """The ``<Kind>List`` object of one page."""
    meta: Obj = {"resourceVersion": str(page.revision)}
    if page.continue_token:
        meta["continue"] = page.continue_token
        meta["remainingItemCount"] = page.remaining
    return {
        "kind": kind.list_kind,
        "apiVersion": kind.api_version,
        "metadata": meta,
        "items": page.items,
    }
