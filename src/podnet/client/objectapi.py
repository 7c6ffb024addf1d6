"""What a controller or an agent loop asks of the API, in-process or over HTTPS.

``ObjectApi`` is implemented by the asyncio HTTPS client (``podnet.client.aio``), so a
controller can run as its own process with a token, and by the master's in-process API
over its watch cache. Objects are plain JSON-like dicts. Every failure is a
``podnet.client.errors.ClientError`` (the in-process API translates its own errors with
``error_from_status``): ``NotFound``, ``AlreadyExists``, ``Conflict`` for a stale
``metadata.resourceVersion`` on update or delete, ``Expired`` from ``watch`` when
``since`` is older than the server keeps (the caller lists again), transient ones
(``is_transient``) worth a retry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from podnet.client.watch import Obj, ResourceVersion, WatchEvent
from podnet.model.kinds import Kind


@dataclass(frozen=True)
class Listing:
    """Every object of a kind (in one namespace, or all) and the listing's revision."""

    items: list[Obj]
    resource_version: ResourceVersion


class ListWatch(Protocol):
    """List and watch: all a reflector needs (an ``ObjectApi``, or a view of one that
    sees fewer objects, such as one name through a field selector)."""

    async def list(self, kind: Kind, namespace: str | None = None) -> Listing:
        """Every object of ``kind``; ``namespace=None`` means all namespaces."""
        ...

    def watch(
        self, kind: Kind, since: ResourceVersion, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        """The changes after revision ``since``: ADDED, MODIFIED, DELETED and BOOKMARK
        events until the server ends the watch. Raises ``Expired`` when ``since`` is too
        old to watch from."""
        ...


class ObjectApi(ListWatch, Protocol):
    """List, watch, get, create, update with a precondition, delete."""

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        """One object; ``NotFound`` when there is none."""
        ...

    async def create(self, kind: Kind, obj: Obj, namespace: str | None = None) -> Obj:
        """A new object (the namespace defaults to the object's); ``AlreadyExists``."""
        ...

    async def update(self, kind: Kind, obj: Obj) -> Obj:
        """Replace an object; its ``metadata.resourceVersion`` is the precondition
        (``Conflict`` when the stored object is newer)."""
        ...

    async def delete(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        *,
        resource_version: ResourceVersion | None = None,
    ) -> None:
        """Delete one object, only at ``resource_version`` when given (else ``Conflict``)."""
        ...
