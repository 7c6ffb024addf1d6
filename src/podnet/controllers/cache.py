"""What a controller knows of one kind: the newest version of each object, by name.

Both the watch and the controller's own writes feed an ``ObjectCache``, in any order: a
version older than the one held (or than a deletion seen) is dropped, so the cache never
goes back. ``revision_of`` reads an object's resourceVersion as the integer it compares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]


def name_of(obj: Obj) -> str:
    """A cluster-scoped object's cache key: its name."""
    return str(obj["metadata"]["name"])


def namespaced_key(obj: Obj) -> str:
    """A namespaced object's cache key: ``namespace/name``."""
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


def revision_of(obj: Obj) -> int:
    """The object's resourceVersion as an int (0 when it has none)."""
    return int((obj.get("metadata") or {}).get("resourceVersion") or 0)


class ObjectCache:
    """The newest known version of each object, by name (or by ``key``: namespace/name);
    older versions are ignored."""

    def __init__(self, key: Callable[[Obj], str] = name_of) -> None:
        self._key = key
        self._objects: dict[str, Obj] = {}
        self._deleted: dict[str, int] = {}  # name -> revision of its deletion

    def get(self, name: str) -> Obj | None:
        """The newest known version of ``name``, or None."""
        return self._objects.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._objects

    def __len__(self) -> int:
        return len(self._objects)

    def names(self) -> list[str]:
        return list(self._objects)

    def values(self) -> list[Obj]:
        return list(self._objects.values())

    def put(self, obj: Obj) -> tuple[bool, Obj | None]:
        """Store ``obj`` unless it is stale: (whether it was stored, the version it replaced)."""
        name = self._key(obj)
        revision = revision_of(obj)
        current = self._objects.get(name)
        if current is not None and revision_of(current) >= revision:
            return False, current
        if self._deleted.get(name, 0) >= revision:
            return False, None
        self._objects[name] = obj
        self._deleted.pop(name, None)
        return True, current

    def remove(self, name: str, revision: int) -> Obj | None:
        """Forget ``name`` as deleted at ``revision``; the removed object, or None."""
        current = self._objects.get(name)
        if current is not None and revision_of(current) > revision:
            return None
        self._deleted[name] = max(revision, self._deleted.get(name, 0))
        return self._objects.pop(name, None)

    def forget_deletions(self, upto: int) -> None:
        """Drop deletion records at or before ``upto`` (a full listing has superseded them)."""
        self._deleted = {n: r for n, r in self._deleted.items() if r > upto}
