"""The watch cache: lists from its current objects, list revision rules, encode-once fan-out
and a slow watcher that falls behind alone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from podnet.api import listing
from podnet.api.cachedobjects import WatchFilter
from podnet.api.params import ContinueToken, QueryParams
from podnet.api.registry import Registry
from podnet.api.watchcache import COALESCE_MAX, WatchCache, coalescing_window
from podnet.model import errors
from podnet.model.kinds import NAMESPACE, POD
from podnet.model.selectors import FieldRequirement, parse_label_selector
from podnet.store.memory import MemoryStore
from podnet.testing.api import namespace, pod


class FakeSink:
    """A transport: a reader drains at once; a stalled one keeps every byte buffered."""

    def __init__(self, stalled: bool = False) -> None:
        self.chunks: list[bytes] = []
        self.stalled = stalled

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.chunks)) if self.stalled else 0

    def is_closing(self) -> bool:
        return False

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines inside the chunked-encoded bytes written so far."""
        raw, out = b"".join(self.chunks), []
        while raw:
            size, _, rest = raw.partition(b"\r\n")
            body, raw = rest[: int(size, 16)], rest[int(size, 16) + 2 :]
            out += [json.loads(line) for line in body.splitlines() if line]
        return out


@pytest.fixture
async def cached() -> AsyncIterator[tuple[Registry, WatchCache]]:
    registry = Registry(MemoryStore())
    await registry.create(NAMESPACE, namespace("default"))
    cache = WatchCache(registry, backlog_limit=4000, coalesce=0)
    await cache.start()
    try:
        yield registry, cache
    finally:
        await cache.stop()


async def settle(registry: Registry, cache: WatchCache) -> int:
    revision = await registry.store.revision()
    assert await cache.wait_for(revision, 5)
    await asyncio.sleep(0)  # the dispatch runs on the next loop turn
    return revision


async def create_pods(registry: Registry, cache: WatchCache, count: int) -> None:
    """Pods p0, p1, ... created, and the cache caught up with them."""
    for i in range(count):
        await registry.create(POD, pod(f"p{i}"))
    await settle(registry, cache)


def names(cache: WatchCache, *args: Any, **kwargs: Any) -> list[str]:
    return [o.obj["metadata"]["name"] for _, o in cache.objects(*args, **kwargs)[0]]


async def test_list_from_cache_with_selectors(cached: tuple[Registry, WatchCache]) -> None:
    registry, cache = cached
    await registry.create(NAMESPACE, namespace("other"))
    await registry.create(POD, pod("a", "default", "n1", {"app": "x"}))
    await registry.create(POD, pod("b", "default", "n2", {"app": "y"}))
    created = await registry.create(POD, pod("c", "other", "n1", {"app": "x"}))
    revision = await settle(registry, cache)
    selected, at = cache.objects(POD)
    items = [o.obj for _, o in selected]
    assert at == revision
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in items] == [
        ("default", "a"),
        ("default", "b"),
        ("other", "c"),
    ]
    assert items[2] == created  # same object, same resourceVersion as the write returned
    assert names(cache, POD, "default") == ["a", "b"]
    assert names(cache, POD, labels=parse_label_selector("app=x")) == ["a", "c"]
    assert names(cache, POD, fields=[FieldRequirement("spec.nodeName", "=", "n2")]) == ["b"]
    await registry.delete(POD, "default", "a")
    await settle(registry, cache)
    assert names(cache, POD, "default") == ["b"]
    assert names(cache, POD) == ["b", "c"]


async def test_list_revision_rules(cached: tuple[Registry, WatchCache]) -> None:
    registry, cache = cached
    await registry.create(POD, pod("a"))
    current = await settle(registry, cache)
    can = listing.cache_can_serve
    assert await can(registry, cache, QueryParams(resource_version=0))
    assert await can(registry, cache, QueryParams())  # consistent: the cache is current
    assert await can(registry, cache, QueryParams(resource_version=current))
    exact = QueryParams(resource_version=current, resource_version_match="Exact")
    assert not await can(registry, cache, exact)  # exact reads go to etcd
    with pytest.raises(errors.ApiError) as future:
        await can(registry, cache, QueryParams(resource_version=current + 100))
    assert future.value.code == 504
    # The cache has not seen a revision etcd has: RV=N waits for it.
    cache._latest_revision = current - 1
    waiting = asyncio.create_task(can(registry, cache, QueryParams(resource_version=current)))
    await asyncio.sleep(0)
    assert not waiting.done()
    await registry.create(POD, pod("b"))
    assert await waiting


async def test_pages_and_an_expired_continue_token(cached: tuple[Registry, WatchCache]) -> None:
    registry, cache = cached
    await create_pods(registry, cache, 5)
    seen: list[str] = []
    revisions = set()
    params = QueryParams(limit=2)
    for _ in range(5):
        assert await listing.cache_can_serve(registry, cache, params)
        selected, revision = cache.objects(POD)
        page = listing.page_of(selected, revision, params)
        seen += [o.obj["metadata"]["name"] for o in page.items]
        revisions.add(page.revision)
        if not page.continue_token:
            break
        assert page.remaining == 5 - len(seen)
        params = QueryParams(limit=2, continue_token=ContinueToken.decode(page.continue_token))
    assert seen == [f"p{i}" for i in range(5)] and len(revisions) == 1
    token = ContinueToken(revisions.pop(), "default/p1")
    await registry.create(POD, pod("late"))
    await registry.store.compact(await registry.store.revision())
    with pytest.raises(errors.ApiError) as expired:
        await listing.cache_can_serve(registry, cache, QueryParams(continue_token=token))
    assert expired.value.code == 410 and expired.value.reason == "Expired"


async def test_each_event_is_encoded_once_for_every_watcher(
    cached: tuple[Registry, WatchCache],
) -> None:
    registry, cache = cached
    start = await settle(registry, cache)
    everyone = WatchFilter(POD)
    sinks = [FakeSink() for _ in range(3)]
    for sink in sinks:
        cache.watch(everyone, sink, start, bookmarks=False)
    app_x = FakeSink()
    cache.watch(WatchFilter(POD, labels=parse_label_selector("app=x")), app_x, start, False)
    await registry.create(POD, pod("a", labels={"app": "x"}))
    await registry.create(POD, pod("b", labels={"app": "y"}))
    await settle(registry, cache)
    assert all(len(sink.chunks) >= 1 for sink in sinks)
    written = [chunk for sink in sinks for chunk in sink.chunks]
    for i, chunk in enumerate(sinks[0].chunks):
        assert all(sink.chunks[i] is chunk for sink in sinks)  # one bytes object for all
    assert len(written) == 3 * len(sinks[0].chunks)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in sinks[0].events()] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]
    assert [e["object"]["metadata"]["name"] for e in app_x.events()] == ["a"]
    rv = sinks[0].events()[1]["object"]["metadata"]["resourceVersion"]
    assert rv == (await registry.get(POD, "default", "b"))["metadata"]["resourceVersion"]


async def test_a_stalled_watcher_falls_behind_alone(cached: tuple[Registry, WatchCache]) -> None:
    registry, cache = cached
    start = await settle(registry, cache)
    readers = [FakeSink() for _ in range(4)]
    reader_watchers = [cache.watch(WatchFilter(POD), s, start, False) for s in readers]
    stalled = FakeSink(stalled=True)
    stuck = cache.watch(WatchFilter(POD), stalled, start, False)
    total = 40  # each event is ~300 bytes: far over the 4000-byte backlog limit
    for i in range(total):
        await registry.create(POD, pod(f"p{i}"))
        await settle(registry, cache)
    for sink in readers:
        assert [e["object"]["metadata"]["name"] for e in sink.events()] == [
            f"p{i}" for i in range(total)
        ]
    assert all(not w.done.done() for w in reader_watchers)
    assert stuck.done.done()
    outcome = stuck.done.result()
    assert outcome is not None and outcome.code == 410 and outcome.reason == "Expired"
    assert 0 < len(stalled.events()) < total
    assert cache.fanout.expired == 1 and len(cache.fanout) == len(readers)


async def test_a_watcher_behind_the_ring_is_told_410(cached: tuple[Registry, WatchCache]) -> None:
    registry, cache = cached
    cache.capacity, cache.history = 3, 0.0
    start = await settle(registry, cache)
    await create_pods(registry, cache, 5)
    assert not cache.covers(start)
    too_late = cache.watch(WatchFilter(POD), FakeSink(), start, False)
    outcome = too_late.done.result()
    assert outcome is not None and outcome.code == 410
    # A watcher inside the ring that is overtaken by it before a dispatch: 410 too.
    behind = cache.watch(WatchFilter(POD), FakeSink(), await registry.store.revision(), False)
    for i in range(4):
        await registry.create(POD, pod(f"q{i}"))  # no settle: the ring moves past it first
    await settle(registry, cache)
    outcome = behind.done.result()
    assert outcome is not None and outcome.code == 410


async def test_changes_close_together_go_out_in_one_write(
    cached: tuple[Registry, WatchCache],
) -> None:
    registry, cache = cached
    cache.coalesce, cache.coalesce_from = 1.0, 1
    start = await settle(registry, cache)
    sink = FakeSink()
    cache.watch(WatchFilter(POD), sink, start, False)
    await registry.create(POD, pod("first"))
    while not sink.chunks:  # the first change goes out at once
        await asyncio.sleep(0.01)
    for name in ("second", "third", "fourth"):
        await registry.create(POD, pod(name))
    while len(sink.chunks) < 2:
        await asyncio.sleep(0.01)
    assert len(sink.chunks) == 2
    names = [e["object"]["metadata"]["name"] for e in sink.events()]
    assert names == ["first", "second", "third", "fourth"]


async def test_bookmark_rounds_deal_every_watcher_one_bookmark_per_period(
    cached: tuple[Registry, WatchCache],
) -> None:
    """Each round of a period writes to its share of the watchers only (no stall of one
    write per watcher at once); over the period's rounds each gets exactly one BOOKMARK,
    at the cache's revision, and a watcher that did not ask gets none."""
    registry, cache = cached
    start = await settle(registry, cache)
    asking = [FakeSink() for _ in range(6)]
    for sink in asking:
        cache.watch(WatchFilter(POD), sink, start, bookmarks=True)
    silent = FakeSink()
    cache.watch(WatchFilter(POD), silent, start, bookmarks=False)
    end = cache._offset + len(cache._events)
    for turn in range(3):
        cache.fanout.bookmark(start, end, turn, 3)
        assert sum(len(sink.chunks) for sink in asking) == 2 * (turn + 1)
    for sink in asking:
        (event,) = sink.events()
        assert event["type"] == "BOOKMARK"
        assert event["object"]["metadata"]["resourceVersion"] == str(start)
    assert silent.chunks == []


async def test_the_ring_keeps_recent_history_beyond_its_capacity(
    cached: tuple[Registry, WatchCache],
) -> None:
    """A burst of other writes (5,000 Leases renewed) must not push a pod event out
    while it is younger than the history: a watcher reconnecting from it still resumes.
    Older events beyond the capacity go."""
    registry, cache = cached
    cache.capacity, cache.history = 3, 3600.0
    start = await settle(registry, cache)
    await create_pods(registry, cache, 8)
    assert cache.covers(start)
    sink = FakeSink()
    cache.watch(WatchFilter(POD), sink, start, False)
    await settle(registry, cache)
    assert [e["object"]["metadata"]["name"] for e in sink.events()] == [f"p{i}" for i in range(8)]
    cache.history = 0.0  # now every event beyond the capacity is too old
    await registry.create(POD, pod("last"))
    await settle(registry, cache)
    assert not cache.covers(start)
    assert len(cache._events) == 3


async def test_a_bookmark_round_goes_out_while_changes_wait_for_their_dispatch() -> None:
    """Under a steady stream of writes some change is always waiting to be dispatched:
    the round still goes out, at the last dispatched revision (never one the watcher
    has not had), and the waiting change follows it."""
    registry = Registry(MemoryStore())
    await registry.create(NAMESPACE, namespace("default"))
    cache = WatchCache(registry, coalesce=30.0, coalesce_from=1, bookmark_period=1e6)
    await cache.start()
    try:
        start = await settle(registry, cache)
        sink = FakeSink()
        cache.watch(WatchFilter(POD), sink, start, bookmarks=True)
        cache._last_dispatch = 0.0  # the window is over: the first change goes at once
        first = await registry.create(POD, pod("first"))
        while not sink.chunks:
            await asyncio.sleep(0.01)
        await registry.create(POD, pod("waiting"))  # held back by the 30 s window
        await settle(registry, cache)
        cache._bookmark(0)
        events = sink.events()
        assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
        version = first["metadata"]["resourceVersion"]
        assert events[1]["object"]["metadata"]["resourceVersion"] == version
        cache._dispatch()
        assert [e["object"]["metadata"]["name"] for e in sink.events()[2:]] == ["waiting"]
    finally:
        await cache.stop()


def test_the_coalescing_window_grows_with_the_watchers_up_to_its_cap() -> None:
    """Few watchers: every change at once. From the threshold, at least the base
    window, longer as a round of writes gets dearer, never past the cap."""
    assert coalescing_window(499, 0.1, 500) == 0.0
    assert coalescing_window(500, 0.1, 500) == 0.1
    assert 0.1 < coalescing_window(6000, 0.1, 500) < COALESCE_MAX
    assert coalescing_window(10_000, 0.1, 500) == COALESCE_MAX == coalescing_window(10**6, 0.1, 500)
    assert coalescing_window(10_000, 1.0, 1) == 1.0  # a longer base stands
