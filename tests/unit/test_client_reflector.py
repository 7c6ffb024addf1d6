"""The reflector over an in-memory ObjectApi: first listing, live changes, relist after
410 with synthesized DELETED, resume after a transient failure, bookmarks, resync, and
which errors end the stream."""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from podnet.client import (
    ADDED,
    BOOKMARK,
    DELETED,
    LISTED,
    MODIFIED,
    Backoff,
    Expired,
    Listing,
    ObjectApi,
    ResourceVersion,
    StatusError,
    Unreachable,
    WatchEvent,
    bookmark,
)
from podnet.client.reflector import Reflector, Reflectors, reflect
from podnet.model.kinds import POD, Kind

Obj = dict[str, Any]
FAST = Backoff(0.001, 0.002)


class MemoryApi:
    """Just enough of an API server: a revision counter, an event history that can be
    compacted, watches that can be told to fail once, and a log of what was asked."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Obj] = {}
        self.revision = 0
        self.history: list[WatchEvent] = []
        self.compacted = 0
        self.changed = asyncio.Condition()
        self.calls: list[tuple[str, ResourceVersion]] = []
        self.list_errors: list[Exception] = []
        self.watch_errors: list[Exception | None] = []  # None: end the watch normally
        self.bookmarks: list[WatchEvent] = []

    async def put(self, namespace: str, name: str, **fields: Any) -> Obj:
        self.revision += 1
        key = (namespace, name)
        meta = {"namespace": namespace, "name": name, "resourceVersion": str(self.revision)}
        obj = {"kind": "Pod", "metadata": meta, **fields}
        kind = MODIFIED if key in self.objects else ADDED
        self.objects[key] = obj
        await self._record(WatchEvent(kind, copy.deepcopy(obj)))
        return obj

    async def remove(self, namespace: str, name: str) -> None:
        self.revision += 1
        obj = self.objects.pop((namespace, name))
        obj["metadata"]["resourceVersion"] = str(self.revision)
        await self._record(WatchEvent(DELETED, obj))

    async def mark(self) -> None:
        """A bookmark at the current revision (sent to the watch, not stored)."""
        self.bookmarks.append(WatchEvent(BOOKMARK, bookmark(self.revision)))
        async with self.changed:
            self.changed.notify_all()

    def compact(self) -> None:
        self.compacted = self.revision
        self.history = [e for e in self.history if e.resource_version > self.compacted]

    async def fail_watches(self, *errors: Exception | None) -> None:
        self.watch_errors.extend(errors)
        async with self.changed:
            self.changed.notify_all()

    async def _record(self, event: WatchEvent) -> None:
        self.history.append(event)
        async with self.changed:
            self.changed.notify_all()

    async def list(self, kind: Kind, namespace: str | None = None) -> Listing:
        self.calls.append(("list", self.revision))
        if self.list_errors:
            raise self.list_errors.pop(0)
        items = [copy.deepcopy(o) for k, o in sorted(self.objects.items())]
        return Listing(items, self.revision)

    async def watch(
        self, kind: Kind, since: ResourceVersion, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        self.calls.append(("watch", since))
        if since < self.compacted:
            raise Expired(f"too old resource version: {since}", 410, "Expired")
        sent = since
        while True:
            if self.watch_errors:
                error = self.watch_errors.pop(0)
                if error is None:
                    return
                raise error
            for event in [e for e in self.history if e.resource_version > sent]:
                sent = event.resource_version
                yield event
            while self.bookmarks:
                yield self.bookmarks.pop(0)
            async with self.changed:
                await self.changed.wait_for(functools.partial(self._news, sent))

    def _news(self, sent: ResourceVersion) -> bool:
        """Whether a watch that sent everything up to ``sent`` has more to do."""
        newer = any(e.resource_version > sent for e in self.history)
        return newer or bool(self.watch_errors or self.bookmarks)

    async def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        raise NotImplementedError

    async def create(self, kind: Kind, obj: Obj, namespace: str | None = None) -> Obj:
        raise NotImplementedError

    async def update(self, kind: Kind, obj: Obj) -> Obj:
        raise NotImplementedError

    async def delete(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        *,
        resource_version: ResourceVersion | None = None,
    ) -> None:
        raise NotImplementedError


def names(event: WatchEvent) -> tuple[str, list[str]]:
    objects = event.items if event.type == LISTED else (event.object,)
    return str(event.type), [o["metadata"]["name"] for o in objects]


async def take(stream: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    got = []
    async with asyncio.timeout(30):
        async for event in stream:
            got.append(event)
            if len(got) == count:
                break
    return got


async def shop_api() -> MemoryApi:
    """An API holding pods ``shop/a`` and ``shop/b``."""
    memory = MemoryApi()
    await memory.put("shop", "a")
    await memory.put("shop", "b")
    return memory


@pytest.fixture
async def api() -> MemoryApi:
    return await shop_api()


async def test_listing_then_live_changes(api: MemoryApi) -> None:
    checked: ObjectApi = api  # the fake is an ObjectApi
    stream = reflect(checked, POD, backoff=FAST)
    first = await take(stream, 1)
    assert names(first[0]) == (LISTED, ["a", "b"])
    assert first[0].resource_version == 2
    await api.put("shop", "c")
    await api.put("shop", "a", spec={"x": 1})
    await api.remove("shop", "b")
    changes = await take(stream, 3)
    assert [names(e) for e in changes] == [(ADDED, ["c"]), (MODIFIED, ["a"]), (DELETED, ["b"])]
    assert [e.resource_version for e in changes] == [3, 4, 5]
    await stream.aclose()
    assert api.calls == [("list", 2), ("watch", 2)]


async def test_relist_after_410_synthesizes_deleted_for_vanished_objects(api: MemoryApi) -> None:
    stream = reflect(api, POD, backoff=FAST)
    await take(stream, 1)
    await api.put("shop", "c")
    assert names((await take(stream, 1))[0]) == (ADDED, ["c"])
    # The watch drops; before it is back, b and c go, d comes and the history of those
    # changes is compacted away (the stream is pulled again only below).
    await api.fail_watches(Unreachable("memory", "dropped"))
    await api.remove("shop", "b")
    await api.remove("shop", "c")
    await api.put("shop", "d")
    api.compact()
    events = await take(stream, 3)
    assert [names(e) for e in events] == [
        (DELETED, ["b"]),
        (DELETED, ["c"]),
        (LISTED, ["a", "d"]),
    ]
    tombstone = events[0].object
    assert tombstone["metadata"] == {"name": "b", "namespace": "shop", "resourceVersion": "6"}
    assert (tombstone["kind"], tombstone["apiVersion"]) == ("Pod", "v1")
    assert events[1].object["metadata"]["resourceVersion"] == "6"
    assert events[2].resource_version == 6
    await stream.aclose()
    assert [rv for call, rv in api.calls if call == "list"] == [2, 6]
    assert [rv for call, rv in api.calls if call == "watch"] == [2, 3]  # 3: Expired


async def test_resume_after_a_transient_failure_from_the_last_version(api: MemoryApi) -> None:
    stream = reflect(api, POD, backoff=FAST)
    await take(stream, 1)
    await api.put("shop", "c")
    await take(stream, 1)
    await api.fail_watches(Unreachable("memory", "connection reset"))
    await api.put("shop", "d")
    assert names((await take(stream, 1))[0]) == (ADDED, ["d"])
    api.revision += 5  # writes to other kinds
    await api.mark()  # a bookmark moves the version on and is not passed on
    await api.fail_watches(None)  # the server ends the watch (its timeout)
    await api.put("shop", "e")
    assert names((await take(stream, 1))[0]) == (ADDED, ["e"])
    await stream.aclose()
    assert api.calls == [("list", 2), ("watch", 2), ("watch", 3), ("watch", 9)]


async def test_resync_lists_again_without_a_410(api: MemoryApi) -> None:
    reflector = Reflector(api, POD, resync_period=0.01, backoff=FAST)
    stream = reflector.events()
    events = await take(stream, 2)
    assert [names(e) for e in events] == [(LISTED, ["a", "b"]), (LISTED, ["a", "b"])]
    await stream.aclose()
    assert reflector.known == {("shop", "a"), ("shop", "b")}


async def test_listing_errors_transient_retried_permanent_raised(api: MemoryApi) -> None:
    api.list_errors = [Unreachable("memory", "refused")]
    stream = Reflectors(api, backoff=FAST).watch(POD)
    assert names((await take(stream, 1))[0]) == (LISTED, ["a", "b"])
    await stream.aclose()
    api.list_errors = [StatusError("no listing pods", 403, "Forbidden")]
    with pytest.raises(StatusError, match="no listing pods"):
        await take(reflect(api, POD, backoff=FAST), 1)


async def test_a_permanent_watch_error_ends_the_stream(api: MemoryApi) -> None:
    stream = reflect(api, POD, backoff=FAST)
    await take(stream, 1)
    await api.fail_watches(StatusError("no watching", 403, "Forbidden"))
    with pytest.raises(StatusError, match="no watching"):
        await take(stream, 1)
