"""The watch vocabulary every podnet client and consumer shares.

A watch (``ObjectApi.watch``, the ``?watch=true`` stream) yields ``WatchEvent``s of type
``ADDED``, ``MODIFIED``, ``DELETED`` and ``BOOKMARK`` (a bookmark's object carries only
``metadata.resourceVersion``: "you are up to date to here"). When the resourceVersion a
watch starts from is older than the server keeps, the watch raises
``podnet.client.errors.Expired`` (410 Gone): the only way on is a new listing.

The reflector (``podnet.client.reflector``) turns listings and watches into one endless
stream for consumers, and represents "relist after 410" with one more type, ``LISTED``:

- ``LISTED``: a complete listing. ``items`` holds every object; ``object`` is
  bookmark-shaped, its resourceVersion the listing's. The first event of a reflector is
  always ``LISTED``; a later ``LISTED`` means the reflector listed again (after 410
  Expired, or when its resync period ended). Just before a later ``LISTED``, the reflector
  emits a ``DELETED`` for every object that vanished since it last saw it.
- ``ADDED``/``MODIFIED``/``DELETED`` as the watch sent them. Bookmarks are not passed on.

A ``ResourceVersion`` is the etcd revision of a write, as an int (0: none, or "any").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias

from podnet.client.errors import InvalidResponse, error_from_status_object
from podnet.client.paths import metadata

Obj = dict[str, Any]
ResourceVersion: TypeAlias = int


class EventType(StrEnum):
    """What happened: the watch types of Kubernetes, plus the reflector's ``LISTED``."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    LISTED = "LISTED"


ADDED, MODIFIED, DELETED = EventType.ADDED, EventType.MODIFIED, EventType.DELETED
BOOKMARK, LISTED = EventType.BOOKMARK, EventType.LISTED


@dataclass(slots=True)
class WatchEvent:
    """One change (``object``), a bookmark, or a complete listing (``items``). Read-only
    by convention: not frozen, because a frozen dataclass costs twice as much to make
    and a busy watch makes one per line."""

    type: EventType | str
    object: Obj = field(default_factory=dict)
    items: tuple[Obj, ...] = ()

    @property
    def resource_version(self) -> ResourceVersion:
        """The resourceVersion of the object (of the listing, for ``LISTED``)."""
        return resource_version(self.object)


def resource_version(obj: Mapping[str, Any]) -> ResourceVersion:
    """An object's ``metadata.resourceVersion`` as an int (0 when absent or not a number)."""
    return parse_version(metadata(obj).get("resourceVersion"))


def parse_version(value: object) -> ResourceVersion:
    """A resourceVersion as it is written (a string of digits) as an int; 0 otherwise."""
    if type(value) is str and value.isdigit():  # the usual case, checked cheaply
        return int(value)
    try:
        return int(value or 0)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


def bookmark(version: ResourceVersion) -> Obj:
    """A bookmark-shaped object: nothing but ``metadata.resourceVersion``."""
    return {"metadata": {"resourceVersion": str(version)}}


def listed(items: tuple[Obj, ...], version: ResourceVersion) -> WatchEvent:
    """The ``LISTED`` event of a listing at ``version``."""
    return WatchEvent(LISTED, bookmark(version), items)


def decode_event(line: bytes | str) -> WatchEvent:
    """One line of a watch stream as an event; an ``ERROR`` event raises its error (for
    example ``Expired``), an unreadable line ``InvalidResponse``."""
    try:
        event = json.loads(line)
        kind, obj = event["type"], event["object"]
        known = _TYPES.get(kind)
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidResponse(f"bad watch event: {str(line)[:120]}", 200) from exc
    if type(obj) is not dict:
        raise InvalidResponse(f"bad watch event: {str(line)[:120]}", 200)
    if known is None:
        if kind == "ERROR":
            raise error_from_status_object(obj)
        raise InvalidResponse(f"unknown watch event type {kind!r}", 200)
    return WatchEvent(known, obj)


_TYPES = {t.value: t for t in (ADDED, MODIFIED, DELETED, BOOKMARK)}
