"""Where objects live in the API: kind names and URL paths (shared by every client)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podnet.client.errors import UnknownKind
from podnet.model.kinds import KINDS, Kind

KindRef = Kind | str


def resolve_kind(kind: KindRef) -> Kind:
    """A ``Kind`` from a Kind or any name a user may type for it."""
    if isinstance(kind, Kind):
        return kind
    found = KINDS.by_name(kind)
    if found is None:
        raise UnknownKind(kind)
    return found


def resource_path(
    kind: KindRef, namespace: str | None = None, name: str | None = None, subresource: str = ""
) -> str:
    """The URL path of a collection, an object or an object's subresource.

    A namespaced kind with ``namespace=None`` gives the all-namespaces collection; a
    cluster-scoped kind ignores ``namespace``.
    """
    k = resolve_kind(kind)
    parts = [k.base_path()]
    if k.namespaced and namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(k.plural)
    if name is not None:
        if k.namespaced and not namespace:
            raise ValueError(f"a namespace is needed to address {k.singular} {name!r}")
        parts.append(name)
        if subresource:
            parts.append(subresource)
    return "/".join(parts)


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's ``metadata`` ({} when it has none)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):  # the usual case, and a much cheaper check than the ABC's
        return meta
    return meta if isinstance(meta, Mapping) else {}


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of an object: its identity within one kind."""
    meta = metadata(obj)
    return meta.get("namespace") or "", meta.get("name") or ""
