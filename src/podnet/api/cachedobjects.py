"""What the watch cache holds: the current objects of each kind and the recent changes.

Both keep bytes (``podnet.api.storedform``), not decoded objects, plus a small
*probe* per object (its name, namespace, labels and selectable fields) so that label and
field selectors are answered without decoding. A decoded object is made only on demand
(``CachedEvent.obj``, ``CachedObject.obj``), fresh for each caller.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from podnet.api import storedform
from podnet.api.objects import matches
from podnet.model.kinds import Kind
from podnet.model.selectors import FieldRequirement, LabelSelector

Obj = dict[str, Any]


@dataclass(slots=True)
class CachedObject:
    """One current object: its JSON as served (resourceVersion spliced in once), its
    revision and its probe. Lists join these bytes; nothing is encoded per request."""

    wire: bytes
    revision: int
    probe: Obj

    @property
    def obj(self) -> Obj:
        """The object, decoded (a new dict on every call)."""
        obj: Obj = storedform.loads(self.wire)
        return obj


class KeyedView(Sequence[tuple[str, CachedObject]]):
    """``(key, object)`` pairs over a run of sorted keys, made only when read: a page of a
    large kind costs its ``limit``, not every object of the kind. It reads the cache as it
    is when read: take what you need from it before the next ``await``."""

    __slots__ = ("_items", "_keys")

    def __init__(self, keys: Sequence[str], items: dict[str, CachedObject]) -> None:
        self._keys = keys
        self._items = items

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return KeyedView(self._keys[index], self._items)
        key = self._keys[index]
        return key, self._items[key]


class KindObjects:
    """The current objects of one kind, by key relative to the kind (``ns/name``)."""

    __slots__ = ("_joined", "_sorted", "items")

    def __init__(self) -> None:
        self.items: dict[str, CachedObject] = {}
        self._sorted: list[str] | None = None
        self._joined: bytes | None = None

    def put(self, key: str, obj: CachedObject) -> None:
        if key not in self.items:
            self._sorted = None
        self.items[key] = obj
        self._joined = None

    def delete(self, key: str) -> CachedObject | None:
        gone = self.items.pop(key, None)
        if gone is not None:
            self._sorted = self._joined = None
        return gone

    def joined(self) -> bytes:
        """Every object's JSON in key order, comma-separated (kept until a change): the
        items of a full list, built once for every client that lists the whole kind."""
        if self._joined is None:
            items = self.items
            self._joined = b",".join([items[key].wire for key in self.sorted_keys()])
        return self._joined

    def namespaces(self) -> set[str]:
        """The namespaces of the keys (``ns/name``): one jump over each namespace's run
        of sorted keys, so 150,000 pods in 150 namespaces cost 150 bisections."""
        keys = self.sorted_keys()
        found: set[str] = set()
        at = 0
        while at < len(keys):
            namespace = keys[at].partition("/")[0]
            found.add(namespace)
            at = bisect.bisect_left(keys, namespace + "/\xff", at)
        return found

    def sorted_keys(self) -> list[str]:
        """Every key in order (kept until a key is added or removed)."""
        if self._sorted is None:
            self._sorted = sorted(self.items)
        return self._sorted


@dataclass(slots=True)
class CachedEvent:
    """A registry change, shared by every watcher.

    ``value`` is the stored bytes of the object as the event shows it (the old object for
    a DELETED event); ``lines`` holds, per event type a watcher sees, the JSON line built
    once for all of them.
    """

    revision: int
    kind: Kind
    namespace: str | None
    name: str
    type: str  # ADDED, MODIFIED, DELETED
    value: bytes
    probe: Obj
    prev_probe: Obj | None
    lines: dict[str, bytes] = field(default_factory=dict)
    arrived: float = 0.0  # loop time it reached the cache

    @property
    def obj(self) -> Obj:
        """The event's object, decoded (a new dict on every call)."""
        return storedform.decode(self.value, self.revision)

    def line(self, seen: str) -> bytes:
        """``{"type":..., "object":...}`` and a newline, as a watcher seeing ``seen`` gets it."""
        cached = self.lines.get(seen)
        if cached is None:
            body = storedform.splice(self.value, self.revision)
            cached = b'{"type":"%s","object":%s}\n' % (seen.encode(), body)
            self.lines[seen] = cached
        return cached


@dataclass(frozen=True)
class WatchFilter:
    """Which events one watcher gets: a kind, maybe a namespace, maybe selectors."""

    kind: Kind
    namespace: str | None = None
    labels: LabelSelector | None = None
    fields: Sequence[FieldRequirement] = ()

    def selects(self, probe: Obj | None) -> bool:
        return probe is not None and matches(probe, self.labels, self.fields)

    def view(self, event: CachedEvent) -> str | None:
        """The event type this watcher sees, or None (kube's filtered-watch rules)."""
        if event.kind is not self.kind:
            return None
        if self.namespace and event.namespace != self.namespace:
            return None
        now, before = self.selects(event.probe), self.selects(event.prev_probe)
        if event.type == "DELETED":
            return "DELETED" if before or now else None
        if now and before:
            return "MODIFIED"
        if now:
            return "ADDED"
        return "DELETED" if before else None

    def group(self) -> tuple[Any, ...]:
        """Watchers with equal groups see the same events (hashable)."""
        return (self.kind, self.namespace, self.labels, tuple(self.fields))
